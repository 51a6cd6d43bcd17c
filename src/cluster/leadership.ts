// Which server leads: the one that runs the reconciler, jobs, update checks, budget alerts
// and the notifier (DESIGN.md "Scale beyond one machine"); the others stand by.
//
// On PostgreSQL the leader holds an advisory lock on a connection of its own. PostgreSQL
// drops the lock the moment that session ends: a leader killed with SIGKILL loses it as
// soon as the kernel closes its socket, and one whose machine vanished within about 11 s
// (the keepalives postgres-connections.ts sets). Standbys try for the lock every `pollMs`,
// backing off (up to `maxRetryMs`) while the database cannot be reached; such an outage
// is logged once when it starts and once when it ends, not at every try. A server that
// wins bumps `cluster_leader.term`; that term is the fencing token: a write only the
// leader may make runs in a transaction that first reads the term with FOR SHARE
// (`Fence.write`), so a server that lost the lead without noticing yet (a stalled process,
// a cut connection) has its writes refused, and a new leader's bump waits for a write in
// flight to commit first. A leader that loses its session, or finds the term moved on,
// steps down at once; so does one whose check gets no answer within the query deadline
// (a silent database): it cannot know whether its session, and so its lock, still lives.
//
// SQLite has one server by construction (the data dir lock), so it always leads.
import type pg from "pg";
import { sql } from "kysely";
import { LlmgwError, describeError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import { Backoff } from "../core/backoff.ts";
import { destroyClient, endClient } from "../store/postgres-connections.ts";
import { nowIso, type Store, type Tx } from "../store/store.ts";

export const LEADERSHIP_DEFAULTS = {
  /** How often a standby tries for the lock, and a leader checks its session and term. */
  pollMs: 1_000,
  /** A check that takes longer than this counts as a lost session (the query deadline usually ends it first). */
  checkTimeoutMs: 5_000,
  /** The longest wait between tries for the lead while the database cannot be reached. */
  maxRetryMs: 5_000,
} as const;

/** The advisory lock key's first int4; the second is the schema's hash, so schemas of one database do not share a leader. */
const LEADER_LOCK_CLASS = 0x6c6c;

/** A write only the leader may make was refused: this server no longer leads (or never did). */
export class NotLeaderError extends LlmgwError {
  constructor(message: string) {
    super({ message, code: "not_leader", status: 503, retryable: true, headers: { "retry-after": "2" } });
  }
}

/** What the leader's duties are told when the lead changes hands. */
export interface LeadershipListener {
  /** This server now leads with this term; resolves once its duties have started. */
  lead(term: number, previousLeader: string | null): Promise<void>;
  /** This server no longer leads; resolves once its duties have stopped. */
  standBy(why: string): Promise<void>;
}

export interface Fence {
  /** Runs `body` in a transaction that commits only while this server leads with its term. */
  write<T>(body: (trx: Tx) => Promise<T>): Promise<T>;
}

export interface Leadership extends Fence {
  readonly leading: boolean;
  readonly term: number | null;
  start(listener: LeadershipListener): Promise<void>;
  stop(): Promise<void>;
}

/** SQLite: one server, which always leads (term 1); fenced writes are plain transactions. */
export class SoleLeadership implements Leadership {
  leading = false;
  term: number | null = null;
  private listener: LeadershipListener | undefined;

  constructor(private readonly store: Store) {}

  async start(listener: LeadershipListener): Promise<void> {
    this.listener = listener;
    this.leading = true;
    this.term = 1;
    await listener.lead(1, null);
  }

  async stop(): Promise<void> {
    if (!this.leading) return;
    this.leading = false;
    await this.listener?.standBy("the server is stopping");
  }

  write<T>(body: (trx: Tx) => Promise<T>): Promise<T> {
    return this.store.db.transaction().execute(body);
  }
}

export class PostgresLeadership implements Leadership {
  leading = false;
  term: number | null = null;
  private client: pg.Client | null = null;
  private timer: NodeJS.Timeout | undefined;
  private listener: LeadershipListener | undefined;
  private stopped = false;
  /** Lead and stand-by run one at a time, in order. */
  private transitions: Promise<void> = Promise.resolve();
  /** The poll in progress, so that `stop` waits for it (it may be opening a session that takes the lock). */
  private checking: Promise<void> | null = null;
  private readonly pollMs: number;
  /** Tries for the lead that failed in a row (the database unreachable): the next waits longer. */
  private readonly retry: Backoff;
  private retryAt = 0;
  /** Since when tries for the lead fail, for the one log line at each end of an outage; null while they work. */
  private failingSince: number | null = null;

  constructor(
    private readonly options: {
      store: Store;
      /** This server's name, recorded as the leader. */
      name: string;
      logger: Logger;
      pollMs?: number;
    },
  ) {
    this.pollMs = options.pollMs ?? LEADERSHIP_DEFAULTS.pollMs;
    this.retry = new Backoff({ baseMs: this.pollMs, maxMs: Math.max(this.pollMs, LEADERSHIP_DEFAULTS.maxRetryMs), jitter: 0.2 });
  }

  async start(listener: LeadershipListener): Promise<void> {
    this.listener = listener;
    await this.check();
    this.timer = setInterval(() => void this.check(), this.pollMs);
    this.timer.unref();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer !== undefined) clearInterval(this.timer);
    await this.checking;
    this.transitions = this.transitions.then(async () => {
      if (this.leading) await this.stepDown("the server is stopping");
    });
    await this.transitions;
    const client = this.client;
    this.client = null;
    // Ending the session releases the lock; a standby takes over within its poll.
    if (client !== null) await endClient(client);
  }

  async write<T>(body: (trx: Tx) => Promise<T>): Promise<T> {
    const term = this.term;
    if (!this.leading || term === null) throw new NotLeaderError("This server does not lead the cluster; the write is left to the leader.");
    return this.options.store.db.transaction().execute(async (trx) => {
      const row = await sql<{ term: number }>`select term from cluster_leader where id = 1 for share`.execute(trx);
      const current = Number(row.rows[0]?.term ?? 0);
      if (current !== term) {
        void this.enqueue(() => this.stepDown(`another server leads now (term ${current}, this server had ${term})`, term));
        throw new NotLeaderError(`This server no longer leads the cluster (term ${current} is another server's); its write was refused.`);
      }
      return body(trx);
    });
  }

  /** One poll: a standby tries for the lock; a leader checks its session and term. */
  private check(): Promise<void> {
    if (this.checking !== null || this.stopped) return this.checking ?? Promise.resolve();
    if (!this.leading && Date.now() < this.retryAt) return Promise.resolve();
    this.checking = (this.leading ? this.checkStillLeading() : this.tryToLead()).finally(() => {
      this.checking = null;
    });
    return this.checking;
  }

  private async tryToLead(): Promise<void> {
    let client: pg.Client;
    try {
      client = await this.session();
      // Stopped while the session opened: it must not take the lock nobody would release.
      if (this.stopped) {
        this.dropSession();
        return;
      }
      const locked = await withTimeout(
        client.query<{ locked: boolean }>("select pg_try_advisory_lock($1, hashtext(current_schema())) as locked", [LEADER_LOCK_CLASS]),
      );
      this.triedAgain();
      if (locked.rows[0]?.locked !== true) return;
    } catch (error) {
      this.dropSession();
      this.tryFailed(error);
      return;
    }
    try {
      const bumped = await client.query<{ term: number; previous: string | null }>(
        "update cluster_leader set term = term + 1, leader = $1, since = $2 where id = 1 returning term, (select leader from cluster_leader where id = 1) as previous",
        [this.options.name, nowIso()],
      );
      const term = Number(bumped.rows[0]!.term);
      await this.enqueue(async () => {
        if (this.stopped) return;
        this.leading = true;
        this.term = term;
        this.options.logger.info({ term, previous: bumped.rows[0]!.previous }, "this server leads the cluster");
        try {
          await this.listener?.lead(term, bumped.rows[0]!.previous);
        } catch (error) {
          // A leader that cannot do its duties must not keep the lock from one that can.
          this.options.logger.error({ err: describeError(error) }, "could not take up the leader's duties; giving the lead up");
          await this.stepDown("its duties failed to start");
          this.dropSession();
        }
      });
    } catch (error) {
      // The lock without a term is no use: give both up and try again.
      this.options.logger.warn({ err: describeError(error) }, "won the leadership lock but could not record the term; trying again");
      this.dropSession();
    }
  }

  private async checkStillLeading(): Promise<void> {
    const client = this.client;
    try {
      if (client === null) throw new Error("the leader's session is gone");
      const row = await withTimeout(client.query<{ term: number }>("select term from cluster_leader where id = 1"));
      const current = Number(row.rows[0]?.term ?? 0);
      if (current !== this.term) {
        const term = this.term;
        await this.enqueue(() => this.stepDown(`another server leads now (term ${current})`, term));
        this.dropSession();
      }
    } catch (error) {
      const term = this.term;
      this.dropSession();
      await this.enqueue(() => this.stepDown(`its PostgreSQL session was lost (${describeError(error)})`, term));
    }
  }

  /** A try for the lead failed: wait longer before the next, and say so once per outage. */
  private tryFailed(error: unknown): void {
    this.retryAt = Date.now() + this.retry.failed();
    if (this.failingSince !== null) return;
    this.failingSince = Date.now();
    this.options.logger.warn({ err: describeError(error) }, "could not try for the cluster's leadership; trying again until the database answers");
  }

  /** A try for the lead reached the database again. */
  private triedAgain(): void {
    this.retry.succeeded();
    this.retryAt = 0;
    if (this.failingSince === null) return;
    this.options.logger.info({ after_ms: Date.now() - this.failingSince }, "can try for the cluster's leadership again");
    this.failingSince = null;
  }

  /** Gives the lead up; `term`: only if this server still leads with that term (a late refusal must not end a newer one). */
  private async stepDown(why: string, term: number | null = this.term): Promise<void> {
    if (!this.leading || this.term !== term) return;
    this.leading = false;
    this.options.logger.warn({ term: this.term, why }, "this server no longer leads the cluster");
    this.term = null;
    await this.listener?.standBy(why);
  }

  private enqueue(transition: () => Promise<void>): Promise<void> {
    this.transitions = this.transitions
      .then(transition)
      .catch((error: unknown) => this.options.logger.error({ err: describeError(error) }, "a change of leadership failed"));
    return this.transitions;
  }

  private async session(): Promise<pg.Client> {
    if (this.client !== null) return this.client;
    const client = await this.options.store.dedicatedClient!();
    client.on("end", () => {
      if (this.client !== client) return;
      this.client = null;
      const term = this.term;
      if (this.leading) void this.enqueue(() => this.stepDown("its PostgreSQL session ended", term));
    });
    this.client = client;
    return client;
  }

  /** Ends the session at once (a polite end could wait for ever on a silent database); PostgreSQL releases the lock when it sees it gone. */
  private dropSession(): void {
    const client = this.client;
    this.client = null;
    if (client !== null) destroyClient(client);
  }
}

function withTimeout<T>(promise: Promise<T>, ms: number = LEADERSHIP_DEFAULTS.checkTimeoutMs): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    promise,
    new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`no answer from PostgreSQL within ${ms} ms`)), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}
