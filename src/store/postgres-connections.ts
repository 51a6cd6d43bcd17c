// PostgreSQL connections that never wait for ever and never end the process: every one
// (pooled or dedicated) has a connect timeout, a client-side query deadline, a server-side
// statement_timeout, and TCP keepalives on both ends, and an 'error' listener from birth.
// pg.Pool listens for errors only on idle clients: a client checked out (a transaction, a
// query in flight) whose socket breaks emits 'error' with nobody listening, which ends the
// process. A query that runs past its deadline leaves pg's client stuck behind the query
// it gave up on; that client is destroyed at once, so the pool drops it and the next
// query gets a fresh connection.
import type { Socket } from "node:net";
import pg from "pg";

/**
 * The deadlines, chosen so that with a silent database an admin call answers 503 within
 * 5 s and /readyz turns 503 within 5 s: the server cancels a slow query first
 * (statementMs, a clean error on a connection that stays usable); the client gives up
 * half a second later (queryMs) only when nothing answers at all.
 */
export const POSTGRES_DEADLINES = {
  /** Opening a connection, or waiting for one from a full pool. */
  connectMs: 3_000,
  /** Server side: statement_timeout. */
  statementMs: 3_000,
  /** Client side: no answer within this and the connection is destroyed. */
  queryMs: 3_500,
  /** The reachability probe behind /readyz and the outage gate. */
  probeMs: 2_000,
  /**
   * TCP keepalives on both ends, for connections that sit idle (LISTEN, the leader's lock):
   * the server drops the session of a client gone without FIN or RST (and with it the
   * leader's advisory lock) after about idle + interval × count = 11 s.
   */
  keepAliveIdleSeconds: 5,
  keepAliveIntervalSeconds: 2,
  keepAliveCount: 3,
} as const;

export interface PostgresTarget {
  /** The --database URL. */
  connectionString: string;
  /** The schema to use as search_path; the server's default when absent. */
  schema?: string;
}

/**
 * What a connection is for: "queries" gets every deadline; "migrations" (on open, which may
 * wait on another server's migration lock or rewrite a big table) only the connect timeout
 * and keepalives, since the pool of queries' deadlines would cut a legitimate long one short.
 */
export type ConnectionPurpose = "queries" | "migrations";

/** Connections in the pool of queries; a query that finds all of them busy waits up to connectMs for one. */
export const QUERY_POOL_SIZE = 10;

const INT8_OID = 20;

/** pg's client settings for one purpose: deadlines, keepalives, the schema, int8 as number. */
function clientConfig(target: PostgresTarget, purpose: ConnectionPurpose): pg.ClientConfig {
  const deadlines = POSTGRES_DEADLINES;
  // Startup options: the server applies these to the session before the first query.
  const sessionOptions = [
    ...(target.schema === undefined ? [] : [`-c search_path=${target.schema}`]),
    `-c tcp_keepalives_idle=${deadlines.keepAliveIdleSeconds}`,
    `-c tcp_keepalives_interval=${deadlines.keepAliveIntervalSeconds}`,
    `-c tcp_keepalives_count=${deadlines.keepAliveCount}`,
  ].join(" ");
  return {
    connectionString: target.connectionString,
    options: sessionOptions,
    connectionTimeoutMillis: deadlines.connectMs,
    keepAlive: true,
    keepAliveInitialDelayMillis: deadlines.keepAliveIdleSeconds * 1000,
    ...(purpose === "queries" ? { statement_timeout: deadlines.statementMs, query_timeout: deadlines.queryMs } : {}),
    // Counts and byte sizes are int8; they fit in a double for anything llmgw stores.
    types: {
      getTypeParser: ((oid: number, format?: "text" | "binary") =>
        oid === INT8_OID ? (value: string) => Number(value) : pg.types.getTypeParser(oid, format as "text")) as typeof pg.types.getTypeParser,
    },
  };
}

/**
 * A pg client with an 'error' listener from the start, destroyed when a query of its runs
 * past the client-side deadline (pg itself only stops waiting: the client stays stuck
 * behind the query it gave up on, and every later query queues behind that one).
 */
class GuardedClient extends pg.Client {
  constructor(config: pg.ClientConfig) {
    super(config);
    this.on("error", () => {
      // The query in flight (if any) already failed with this error, and the pool drops a
      // client that is no longer queryable when it is released; an 'error' event with no
      // listener would end the process.
    });
    const query = this.query.bind(this) as (...args: unknown[]) => unknown;
    // The promise form (Kysely's, the probe's, the change feed's and the leader's) is all llmgw uses.
    Object.assign(this, {
      query: (...args: unknown[]) => {
        const result = query(...args);
        if (result instanceof Promise) {
          result.catch((error: unknown) => {
            if (error instanceof Error && error.message === "Query read timeout") destroyClient(this);
          });
        }
        return result;
      },
    });
  }
}

/** The pool of queries (or of migrations, on open), every client of it guarded and deadline-bound. */
export function createPool(target: PostgresTarget, purpose: ConnectionPurpose): pg.Pool {
  const pool = new pg.Pool({
    ...clientConfig(target, purpose),
    max: purpose === "queries" ? QUERY_POOL_SIZE : 2,
    Client: GuardedClient as unknown as new () => pg.ClientBase,
  });
  pool.on("error", () => {
    // An idle client lost its connection; the pool has removed it and opens another on the next query.
  });
  return pool;
}

/**
 * A connection of its own, outside the pool, with the same deadlines (for what lives as
 * long as a session: LISTEN, the leader's advisory lock). Connected; the caller ends it.
 */
export async function connectDedicatedClient(target: PostgresTarget): Promise<pg.Client> {
  const client = new GuardedClient(clientConfig(target, "queries"));
  try {
    await client.connect();
  } catch (error) {
    destroyClient(client);
    throw error;
  }
  return client;
}

/** Ends a client's connection at once, without the goodbye a silent database would never answer. */
export function destroyClient(client: pg.ClientBase): void {
  const stream = (client as unknown as { connection?: { stream?: Socket } }).connection?.stream;
  stream?.destroy();
}

/**
 * Ends a client politely (the server ends its session and releases what it holds at once),
 * or destroys it when that takes longer than `deadlineMs` (a silent database).
 */
export async function endClient(client: pg.ClientBase, deadlineMs: number = POSTGRES_DEADLINES.connectMs): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([
    (client as pg.Client).end().catch(() => undefined),
    new Promise<void>((resolve) => {
      timer = setTimeout(() => {
        destroyClient(client);
        resolve();
      }, deadlineMs);
    }),
  ]);
  clearTimeout(timer);
}

/**
 * Runs one statement on a connection of its own, opened for it and closed after, within
 * `deadlineMs` in all, connecting included: the reachability probe. Outside the pool, so
 * that a pool whose every connection is busy (slow reports, lock waits) does not read as
 * a database that is down, and so that the probe learns whether a new connection can be
 * made and answered now.
 */
export async function probeConnection(
  target: PostgresTarget,
  statement: { text: string; values?: unknown[] },
  deadlineMs: number = POSTGRES_DEADLINES.probeMs,
): Promise<void> {
  const started = Date.now();
  // pg's connect timeout ends a silent connect with "timeout expired" (a silent fault).
  const client = new GuardedClient({ ...clientConfig(target, "queries"), connectionTimeoutMillis: deadlineMs });
  let failed = false;
  try {
    await client.connect();
    // pg reads a per-query query_timeout that its types do not list.
    const config = { text: statement.text, values: statement.values ?? [], query_timeout: Math.max(1, deadlineMs - (Date.now() - started)) };
    await client.query(config as pg.QueryConfig);
  } catch (error) {
    failed = true;
    throw error;
  } finally {
    // A failed probe's connection is of no more use: dropped at once, with no goodbye a
    // silent database would not answer. A good one ends politely, without holding up the answer.
    if (failed) destroyClient(client);
    else void endClient(client);
  }
}
