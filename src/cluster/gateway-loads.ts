// The gateway load of every server, where the leader can add it up: requests in flight and
// queued per model (what the autoscaler decides from) and in flight per replica (what a
// drain waits for). Each server of a PostgreSQL cluster writes its own `gateway_loads` row
// every second while it has requests, and deletes it once it has none; the leader reads the
// other servers' rows each fleet tick and adds its own counts, read live from its gateway.
//
// A row is counted only while fresh (written within `freshMs` on the database's clock): a
// server that died with requests in flight must not hold replicas up for ever, and a
// server's clock running ahead or behind changes nothing. When the rows cannot be read,
// `refresh` says so and the autoscaler decides nothing on half the picture; drains keep the
// counts read last (they end at their deadline anyway). SQLite has one server: its own
// counts are the whole load, and nothing is written.
import { sql } from "kysely";
import { describeError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import type { GatewayLoad } from "../gateway/admission.ts";
import type { SharedCounts } from "../fleet/drain.ts";
import type { Store } from "../store/store.ts";
import { DATABASE_NOW_ISO } from "./cluster-members.ts";

export const LOAD_DEFAULTS = {
  /** How often a server with requests writes its row. */
  reportMs: 1_000,
  /** A row older than this is a server that stopped writing: not counted. */
  freshMs: 5_000,
  /**
   * How long after a replica leaves routing a read of the rows surely counts every request
   * another server sent it before hearing so: that server's next write (a beat) after it
   * hears of the stop through the change feed (a fraction of a second), with a margin.
   */
  drainSettleMs: 3_000,
} as const;

/** What the fleet reads: the load of all servers together. */
export interface LoadTotals {
  /** The other servers' rows were read within `freshMs` (always true on SQLite). */
  readonly known: boolean;
  /** Requests in flight and queued for the model, all servers together. */
  model(modelId: string): number;
  /** Requests in flight at the replica, all servers together. */
  replica(replicaId: string): number;
}

/** This server's gateway, as far as its load goes. */
export interface LocalLoad {
  load(): GatewayLoad;
  inFlightOf(replicaId: string): number;
}

export class GatewayLoads implements LoadTotals {
  private remote: GatewayLoad = { models: new Map(), replicas: new Map() };
  /** When the other servers' rows were last read (epoch ms), or null before the first read. */
  private readAt: number | null = null;
  private timer: NodeJS.Timeout | undefined;
  private writing: Promise<void> | null = null;
  /** Whether this server's row holds requests (an idle server writes once, to delete it). */
  private rowHoldsLoad = false;
  private warned = false;
  private readonly reportMs: number;
  private readonly freshMs: number;
  private readonly clock: () => number;

  constructor(
    private readonly options: {
      store: Store;
      /** This server's name (cluster_members.name): its row's key. */
      server: string;
      /** This server's gateway; null until it exists (nothing is in flight before). */
      local: () => LocalLoad | null;
      logger: Logger;
      reportMs?: number;
      freshMs?: number;
      /** The fleet's clock (drain times are compared with it); default the wall clock. */
      clock?: (() => number) | undefined;
    },
  ) {
    this.reportMs = options.reportMs ?? LOAD_DEFAULTS.reportMs;
    this.freshMs = options.freshMs ?? LOAD_DEFAULTS.freshMs;
    this.clock = options.clock ?? Date.now;
  }

  private get shared(): boolean {
    return this.options.store.dialect === "postgres";
  }

  /** Starts writing this server's row (PostgreSQL only). */
  start(): void {
    if (!this.shared || this.timer !== undefined) return;
    this.timer = setInterval(() => {
      // One write at a time: a slow database skips a beat rather than piling writes up.
      if (this.writing === null) this.writing = this.report().finally(() => (this.writing = null));
    }, this.reportMs);
    this.timer.unref();
  }

  /** Stops writing and deletes this server's row, so the leader stops counting it at once. */
  async stop(): Promise<void> {
    if (this.timer !== undefined) clearInterval(this.timer);
    this.timer = undefined;
    await this.writing;
    if (!this.shared) return;
    await this.options.store.db
      .deleteFrom("gateway_loads")
      .where("server", "=", this.options.server)
      .execute()
      .catch(() => undefined);
  }

  /**
   * What a drain waits on (drain.ts) on PostgreSQL; undefined on SQLite, where this
   * server's counts are all there is.
   */
  drainCounts(): SharedCounts | undefined {
    if (!this.shared) return undefined;
    return { settleMs: LOAD_DEFAULTS.drainSettleMs, readAt: () => this.readAt, known: () => this.known };
  }

  get known(): boolean {
    return !this.shared || (this.readAt !== null && this.clock() - this.readAt < this.freshMs);
  }

  model(modelId: string): number {
    return (this.options.local()?.load().models.get(modelId) ?? 0) + (this.remote.models.get(modelId) ?? 0);
  }

  replica(replicaId: string): number {
    return (this.options.local()?.inFlightOf(replicaId) ?? 0) + (this.remote.replicas.get(replicaId) ?? 0);
  }

  /**
   * Reads the other servers' fresh rows (the leader, each tick). False when they could not
   * be read: the counts read last stay, and `known` turns false once they are stale.
   */
  async refresh(): Promise<boolean> {
    if (!this.shared) return true;
    try {
      const cutoff = sql<string>`to_char((now() - make_interval(secs => ${this.freshMs / 1000})) at time zone 'utc', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')`;
      const rows = await this.options.store.db
        .selectFrom("gateway_loads")
        .select(["server", "loads"])
        .where("server", "<>", this.options.server)
        .where("reported_at", ">=", cutoff)
        .execute();
      const remote: GatewayLoad = { models: new Map(), replicas: new Map() };
      for (const row of rows) addInto(remote, parseLoad(row.loads, row.server, this.options.logger));
      this.remote = remote;
      this.readAt = this.clock();
      this.warned = false;
      return true;
    } catch (error) {
      if (!this.warned)
        this.options.logger.warn({ err: describeError(error) }, "could not read the other servers' gateway loads; autoscaling waits until they can be read");
      this.warned = true;
      return false;
    }
  }

  /** Writes this server's load, or deletes its row once it has none left. */
  private async report(): Promise<void> {
    const load = this.options.local()?.load() ?? { models: new Map(), replicas: new Map() };
    const empty = load.models.size === 0 && load.replicas.size === 0;
    if (empty && !this.rowHoldsLoad) return;
    const db = this.options.store.db;
    try {
      if (empty) {
        await db.deleteFrom("gateway_loads").where("server", "=", this.options.server).execute();
      } else {
        const loads = JSON.stringify({ models: Object.fromEntries(load.models), replicas: Object.fromEntries(load.replicas) });
        await db
          .insertInto("gateway_loads")
          .values({ server: this.options.server, loads, reported_at: DATABASE_NOW_ISO })
          .onConflict((oc) => oc.column("server").doUpdateSet({ loads, reported_at: DATABASE_NOW_ISO }))
          .execute();
      }
      this.rowHoldsLoad = !empty;
    } catch (error) {
      // The next beat tries again; meanwhile the leader counts this server's last row while it is fresh.
      this.options.logger.debug({ err: describeError(error) }, "could not write this server's gateway load");
    }
  }
}

function addInto(total: GatewayLoad, load: GatewayLoad): void {
  for (const [id, count] of load.models) total.models.set(id, (total.models.get(id) ?? 0) + count);
  for (const [id, count] of load.replicas) total.replicas.set(id, (total.replicas.get(id) ?? 0) + count);
}

/** A row's JSON as counts; whatever is not a count is left out (a row from a newer llmgw may carry more). */
function parseLoad(text: string, server: string, logger: Logger): GatewayLoad {
  const load: GatewayLoad = { models: new Map(), replicas: new Map() };
  try {
    const parsed = JSON.parse(text) as { models?: unknown; replicas?: unknown };
    for (const [key, target] of [
      ["models", load.models],
      ["replicas", load.replicas],
    ] as const) {
      const entries = parsed[key];
      if (typeof entries !== "object" || entries === null) continue;
      for (const [id, count] of Object.entries(entries)) if (typeof count === "number" && Number.isFinite(count) && count > 0) target.set(id, count);
    }
  } catch {
    logger.warn({ server }, "a server's gateway load row is not JSON; not counted");
  }
  return load;
}
