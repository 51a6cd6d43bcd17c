// A store on PostgreSQL reached through the TCP fault proxy (fault-proxy.ts), for unit
// tests of what keeps working while the database cannot be reached: the test breaks the
// link with `proxy.set(...)`, and `direct` opens the same schema without the proxy, the
// way another server that can still reach the database would see it. And a `llmgw server`
// process on a database of its own through a fault proxy, for the end-to-end tests.
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import type { TestContext } from "node:test";
import { findFreePort } from "../../src/agent/free-port.ts";
import { openStore, type Store } from "../../src/store/store.ts";
import { createTestDatabase, listeningUrl, spawnLlmgw, stopAll, type LlmgwProcess } from "./cluster-processes.ts";
import { startFaultProxy, type FaultProxy } from "./fault-proxy.ts";
import { dropSchema, postgresProblem, postgresSchemaOrSkip } from "./stores.ts";

export interface PostgresViaProxy {
  store: Store;
  proxy: FaultProxy;
  /** Opens the same schema directly (the caller closes it). */
  direct(): Promise<Store>;
  /** Cuts the link the way a database going away does: open connections reset, new ones refused. */
  cut(): Promise<void>;
  cleanup(): Promise<void>;
}

/** A fresh schema through a fault proxy, or null after skipping the test when PostgreSQL is not reachable. */
export async function postgresViaProxy(t: TestContext): Promise<PostgresViaProxy | null> {
  const spec = await postgresSchemaOrSkip(t);
  if (spec === null) return null;
  const target = new URL(spec.database);
  const proxy = await startFaultProxy({ host: target.hostname, port: Number(target.port || 5432) });
  const store = await openStore({ database: proxy.via(spec.database), schema: spec.schema });
  return {
    store,
    proxy,
    direct: () => openStore({ database: spec.database, schema: spec.schema }),
    async cut() {
      await proxy.set("reset");
      await proxy.set("refuse");
    },
    async cleanup() {
      await proxy.set("forward");
      await store.close().catch(() => undefined);
      await proxy.close();
      await dropSchema(spec.schema);
    },
  };
}

export interface ServerViaProxy {
  server: LlmgwProcess;
  proxy: FaultProxy;
  /** The server's database, reached directly (not through the proxy). */
  databaseUrl: string;
  /** Where the server listens. */
  url: string;
  adminKey: string;
  /** A call to the admin API with the admin key; an empty answer body is null. */
  admin<T>(method: string, pathname: string, body?: unknown): Promise<{ status: number; retryAfter: string | null; body: T }>;
  /** Lets the proxy forward again, stops the server and the proxy, drops the database and removes the data dir. */
  close(): Promise<void>;
}

/**
 * A real `llmgw server` process on a PostgreSQL database of its own reached through a fault
 * proxy, for end-to-end tests of a database that goes away under a running server.
 * `applicationName` marks the server's sessions, so that a test can terminate exactly those;
 * `requiredBy` names the test in the error thrown when PostgreSQL is not reachable.
 */
export async function spawnServerViaProxy(options: { requiredBy: string; clusterSecret: string; applicationName?: string }): Promise<ServerViaProxy> {
  const problem = await postgresProblem();
  if (problem !== null) throw new Error(`PostgreSQL is required for ${options.requiredBy} but is not reachable: ${problem}`);
  const root = mkdtempSync(path.join(tmpdir(), "llmgw-server-via-proxy-"));
  let database: Awaited<ReturnType<typeof createTestDatabase>> | undefined;
  let proxy: FaultProxy | undefined;
  let server: LlmgwProcess | undefined;
  const close = async () => {
    await proxy?.set("forward");
    if (server !== undefined) await stopAll([server]);
    await proxy?.close();
    await database?.drop();
    rmSync(root, { recursive: true, force: true });
  };
  try {
    database = await createTestDatabase();
    const target = new URL(database.url);
    proxy = await startFaultProxy({ host: target.hostname, port: Number(target.port || 5432) });
    const viaProxy = new URL(proxy.via(database.url));
    if (options.applicationName !== undefined) viaProxy.searchParams.set("application_name", options.applicationName);
    const dataDir = path.join(root, "server");
    server = spawnLlmgw(["server", "--data-dir", dataDir, "--listen", `127.0.0.1:${await findFreePort("127.0.0.1")}`, "--database", viaProxy.toString()], {
      LLMGW_CLUSTER_SECRET: options.clusterSecret,
    });
    const url = await listeningUrl(server);
    const adminKey = readFileSync(path.join(dataDir, "admin.key"), "utf8").trim();
    return {
      server,
      proxy,
      databaseUrl: database.url,
      url,
      adminKey,
      admin: async <T>(method: string, pathname: string, body?: unknown) => {
        const response = await fetch(url + pathname, {
          method,
          headers: { authorization: `Bearer ${adminKey}`, "content-type": "application/json" },
          ...(body === undefined ? {} : { body: JSON.stringify(body) }),
        });
        const text = await response.text();
        return { status: response.status, retryAfter: response.headers.get("retry-after"), body: (text === "" ? null : JSON.parse(text)) as T };
      },
      close,
    };
  } catch (error) {
    await close();
    throw error;
  }
}
