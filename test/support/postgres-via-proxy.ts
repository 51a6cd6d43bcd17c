// A store on PostgreSQL reached through the TCP fault proxy (fault-proxy.ts), for unit
// tests of what keeps working while the database cannot be reached: the test breaks the
// link with `proxy.set(...)`, and `direct` opens the same schema without the proxy, the
// way another server that can still reach the database would see it.
import type { TestContext } from "node:test";
import { openStore, type Store } from "../../src/store/store.ts";
import { startFaultProxy, type FaultProxy } from "./fault-proxy.ts";
import { dropSchema, postgresSchemaOrSkip } from "./stores.ts";

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
