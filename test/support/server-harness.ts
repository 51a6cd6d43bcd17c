// Starts a real llmgw server in this process on a free loopback port, with a fresh data
// dir (or one the test gives) and SQLite store, and hands tests its URL, the first-start
// admin key and the parts.
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { silentLogger } from "../../src/core/log.ts";
import type { CatalogModel } from "../../src/catalog/catalog.ts";
import type { NodeAgent, SupervisorTimings } from "../../src/agent/node-agent.ts";
import { startLocalNode } from "../../src/agent/local-node.ts";
import { readNodeIdentity } from "../../src/agent/node-identity.ts";
import type { SmokeTest } from "../../src/serve/smoke-test.ts";
import { startServer, type Attachment, type RunningServer, type ServerConfig, type ServerParts } from "../../src/server/server.ts";

export interface Harness {
  server: RunningServer;
  url: string;
  adminKey: string;
  dataDir: string;
  /** Calls the admin API with the admin key; returns status and parsed body. */
  // biome-ignore lint/suspicious/noExplicitAny: about 150 tests in src/ and test/ read the many answer shapes of the admin API through this one helper; typing it means a type argument at every call.
  admin(method: string, pathname: string, body?: unknown): Promise<{ status: number; body: any }>;
  /** Adds a model through the API (failing the test with the answer if it is refused) and returns it from the catalog. */
  addModel(body: { name: string; [field: string]: unknown }): Promise<CatalogModel>;
  /** The credential of the server's own node (`up`'s in-process agent), from DATA_DIR/agent/node.json. */
  nodeCredential(): string;
  /** Creates a client key through the API and returns it. */
  clientKey(options?: {
    allowed_models?: string[];
    name?: string;
    rpm?: number;
    tpm?: number;
    budget_usd?: number;
    budget_period?: string;
    model_limits?: unknown;
  }): Promise<string>;
  close(): Promise<void>;
}

export interface HarnessOptions {
  /** An empty (or missing) directory to use as the data dir, e.g. on a small file system; removed on close. */
  dataDir?: string;
  /** Another database than the data dir's SQLite file: PostgreSQL (a URL and a schema), e.g. shared by two servers. */
  database?: { database: string; schema?: string };
  /** The admin key, when the database already has one (a second server on a shared database creates none). */
  adminKey?: string;
  maxBodyBytes?: number;
  bodyTimeoutMs?: number;
  headerTimeoutMs?: number;
  keepAliveTimeoutMs?: number;
  stalledReaderMs?: number;
  guardTimeoutMs?: number;
  registryEndpoint?: string;
  registryToken?: string;
  nodeTimeoutMs?: number;
  heartbeatIntervalMs?: number;
  fleetClock?: () => number;
  /** The clock of budget periods and rate windows. */
  limitsClock?: () => number;
  /** How long serve and update jobs wait for a ready replica. */
  replicaTimeoutMs?: number;
  /** The scheduled update check (default off in tests: they call the check themselves). */
  updateCheckIntervalMs?: number;
  /** Replaces the jobs' smoke test (to make a revision fail it). */
  smokeTest?: SmokeTest;
  withAgent?: (parts: ServerParts) => Promise<Attachment>;
  /** The server's metrics key and budget source (GET /metrics). */
  metrics?: Pick<ServerConfig, "metricsKey" | "budgetSpent" | "metricsHosts">;
  /** Events and notifications: backoff, budget alert share and check interval, the console's address. */
  notify?: Pick<ServerConfig, "notify" | "budgetAlertShare" | "budgetCheckIntervalMs" | "publicUrl">;
  /**
   * --allow-private-webhooks. Default true here, unlike the server's: test receivers listen on
   * loopback. Tests of the refusal of private receivers give false.
   */
  allowPrivateWebhooks?: boolean;
  /** How long a console login lasts. */
  consoleSessionTtlMs?: number;
  /**
   * Servers sharing a PostgreSQL database: this one's name and the cluster secret they share
   * (defaults: a random name, and one secret for every harness of the test run).
   */
  cluster?: { name?: string; secret?: string; leaderPollMs?: number; mirrorOn?: string };
}

/** The cluster secret harnesses on one PostgreSQL share unless a test gives another. */
export const TEST_CLUSTER_SECRET = "test-cluster-secret-of-llmgw-harnesses-0123456789";

export async function startHarness(options: HarnessOptions = {}): Promise<Harness> {
  const dataDir = options.dataDir ?? mkdtempSync(path.join(tmpdir(), "llmgw-harness-"));
  mkdirSync(dataDir, { recursive: true });
  const server = await startServer(
    {
      dataDir,
      host: "127.0.0.1",
      port: 0,
      database: options.database?.database ?? path.join(dataDir, "llmgw.db"),
      ...(options.database?.schema === undefined ? {} : { databaseSchema: options.database.schema }),
      logger: silentLogger(),
      maxBodyBytes: options.maxBodyBytes,
      bodyTimeoutMs: options.bodyTimeoutMs,
      headerTimeoutMs: options.headerTimeoutMs,
      keepAliveTimeoutMs: options.keepAliveTimeoutMs,
      stalledReaderMs: options.stalledReaderMs,
      guardTimeoutMs: options.guardTimeoutMs,
      registryEndpoint: options.registryEndpoint,
      registryToken: options.registryToken,
      nodeTimeoutMs: options.nodeTimeoutMs,
      heartbeatIntervalMs: options.heartbeatIntervalMs,
      fleetClock: options.fleetClock,
      limitsClock: options.limitsClock,
      replicaTimeoutMs: options.replicaTimeoutMs,
      updateCheckIntervalMs: options.updateCheckIntervalMs ?? 0,
      ...(options.smokeTest === undefined ? {} : { smokeTest: options.smokeTest }),
      ...options.metrics,
      ...options.notify,
      allowPrivateWebhooks: options.allowPrivateWebhooks ?? true,
      ...(options.consoleSessionTtlMs === undefined ? {} : { consoleSessionTtlMs: options.consoleSessionTtlMs }),
      ...(options.database === undefined
        ? {}
        : {
            serverName: options.cluster?.name ?? `harness-${Math.random().toString(36).slice(2, 8)}`,
            clusterSecret: options.cluster?.secret ?? TEST_CLUSTER_SECRET,
            ...(options.cluster?.leaderPollMs === undefined ? {} : { leaderPollMs: options.cluster.leaderPollMs }),
            ...(options.cluster?.mirrorOn === undefined ? {} : { mirrorOn: options.cluster.mirrorOn }),
          }),
    },
    options.withAgent,
  );
  const adminKey = server.createdAdminKey ?? options.adminKey ?? null;
  if (adminKey === null) throw new Error("a fresh database must create an admin key (or give the harness the one it has)");
  const admin = async (method: string, pathname: string, body?: unknown) => {
    const response = await fetch(server.url + pathname, {
      method,
      headers: { authorization: `Bearer ${adminKey}`, "content-type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await response.text();
    return { status: response.status, body: text === "" ? null : JSON.parse(text) };
  };
  return {
    server,
    url: server.url,
    adminKey,
    dataDir,
    admin,
    addModel: async (body) => {
      const created = await admin("POST", "/api/v1/models", body);
      if (created.status !== 201) throw new Error(`model ${body.name} was refused (${created.status}): ${JSON.stringify(created.body)}`);
      return server.catalog.get(body.name);
    },
    nodeCredential: () => {
      const identity = readNodeIdentity(path.join(dataDir, "agent"));
      if (identity === null) throw new Error("this harness runs no local node");
      return identity.credential;
    },
    clientKey: async (keyOptions: Record<string, unknown> = {}) => {
      const created = await admin("POST", "/api/v1/keys", { name: `client-${Math.random().toString(36).slice(2, 8)}`, ...keyOptions });
      if (created.status !== 201) throw new Error(`key creation failed: ${JSON.stringify(created.body)}`);
      return created.body.key as string;
    },
    close: async () => {
      await server.close();
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

/**
 * A harness whose server runs the local node, as `llmgw up` does: the in-process agent
 * joined to the server's fleet, real engine processes for llamacpp models. Supervisor
 * timings are the caller's (tests shorten them).
 */
export async function startHarnessWithAgent(
  options: HarnessOptions & { supervisor?: SupervisorTimings } = {},
): Promise<{ harness: Harness; agent: NodeAgent }> {
  let agent: NodeAgent | undefined;
  const { supervisor, ...harnessOptions } = options;
  const harness = await startHarness({
    ...harnessOptions,
    withAgent: async (parts) => {
      agent = await startLocalNode(parts, { logger: silentLogger(), name: "local", ...(supervisor === undefined ? {} : { supervisor }) });
      return agent;
    },
  });
  return { harness, agent: agent! };
}
