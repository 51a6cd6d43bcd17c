// A PostgreSQL store, change feed and leadership reached through the TCP fault proxy: a
// link reset under a transaction, sessions terminated by the server, a refused port and a
// database that goes silent (a blackhole) each end in a 503 `storage_unavailable` within
// the deadlines, never in an unhandled 'error' event or a wait without end, and everything
// works again once the link is back, without reopening anything. A pool with every
// connection busy is no outage, and the outage gate probes at its own pace.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { Writable } from "node:stream";
import { sql } from "kysely";
import pg from "pg";
import { createLogger } from "../core/log.ts";
import { ChangeFeed } from "../cluster/change-feed.ts";
import { PostgresLeadership } from "../cluster/leadership.ts";
import { openStore, type Store } from "./store.ts";
import { StorageHealth, StorageUnavailableError } from "./storage-fault.ts";
import { POSTGRES_DEADLINES, QUERY_POOL_SIZE } from "./postgres-connections.ts";
import { OutageGate } from "./postgres-outage.ts";
import { startFaultProxy, type FaultProxy } from "../../test/support/fault-proxy.ts";
import { eventually } from "../../test/support/eventually.ts";
import { Gate } from "../../test/support/gate.ts";
import { dropSchema, postgresProblem, TEST_POSTGRES_URL } from "../../test/support/stores.ts";

/** The bound for a 503 from a silent database; the deadlines aim well under it. */
const SILENT_BOUND_MS = 5_000;

/** An 'error' event nobody listens to, or a rejection nobody handles, ends the process: these tests fail instead. */
const unhandled: unknown[] = [];
const onUnhandled = (error: unknown) => unhandled.push(error);

function isStorageUnavailable(error: unknown): boolean {
  return error instanceof StorageUnavailableError && error.status === 503 && error.code === "storage_unavailable" && error.headers["retry-after"] !== undefined;
}

/** Log lines written, as parsed JSON objects. */
function capturedLogger() {
  const lines: { msg: string; level: number }[] = [];
  const destination = new Writable({
    write(chunk: Buffer, _encoding, done) {
      for (const line of chunk.toString().split("\n")) if (line.trim() !== "") lines.push(JSON.parse(line));
      done();
    },
  });
  return { logger: createLogger({ level: "info", destination, format: "json" }), lines };
}

describe("PostgreSQL faults through a fault proxy", () => {
  let proxy: FaultProxy;
  let store: Store;
  let schema = "";
  /** Marks this test's connections, so the server can end exactly those sessions. */
  const applicationName = `llmgw_faults_${randomBytes(4).toString("hex")}`;
  const viaProxy = () => {
    const url = new URL(proxy.via(TEST_POSTGRES_URL));
    url.searchParams.set("application_name", applicationName);
    return url.toString();
  };
  const asAdministrator = async (text: string): Promise<number> => {
    const admin = new pg.Client({ connectionString: TEST_POSTGRES_URL });
    await admin.connect();
    try {
      return (await admin.query(text, [applicationName])).rowCount ?? 0;
    } finally {
      await admin.end();
    }
  };
  /** Ends every server session of this test's connections, from outside (as a restart or an administrator would). */
  const terminateSessions = () => asAdministrator("select pg_terminate_backend(pid) from pg_stat_activity where application_name = $1");
  const sessionCount = () => asAdministrator("select pid from pg_stat_activity where application_name = $1");
  const works = async () => {
    await store.db
      .insertInto("cluster_settings")
      .values({ name: `n${randomBytes(4).toString("hex")}`, value: "v", updated_at: "now" })
      .execute();
    return true;
  };

  /**
   * A transaction that has run one query and holds its connection (checked out of the pool)
   * until `resume()`, then runs another: `transaction` settles with that second query.
   */
  const heldTransaction = async (on: Store = store) => {
    const gate = new Gate();
    let reached!: () => void;
    const inside = new Promise<void>((resolve) => (reached = resolve));
    const transaction = on.db.transaction().execute(async (trx) => {
      await sql`select 1`.execute(trx);
      reached();
      await gate.wait();
      await sql`select 1`.execute(trx);
    });
    // A first query that fails ends the wait too, with its error.
    await Promise.race([inside, transaction]);
    return { transaction, resume: () => gate.open() };
  };

  before(async () => {
    const problem = await postgresProblem();
    if (problem !== null) throw new Error(`PostgreSQL at ${TEST_POSTGRES_URL} is required for the fault tests but is not reachable: ${problem}`);
    process.on("uncaughtException", onUnhandled);
    process.on("unhandledRejection", onUnhandled);
    const target = new URL(TEST_POSTGRES_URL);
    proxy = await startFaultProxy({ host: target.hostname, port: Number(target.port || 5432) });
    schema = `llmgw_test_${randomBytes(6).toString("hex")}`;
    store = await openStore({ database: viaProxy(), schema });
  });

  after(async () => {
    await proxy.set("forward");
    await store.close().catch(() => undefined);
    await proxy.close();
    await dropSchema(schema);
    process.off("uncaughtException", onUnhandled);
    process.off("unhandledRejection", onUnhandled);
  });

  test("a link reset under a transaction is a 503, the process lives on, and the store works again without a reopen", async () => {
    await works();
    // A transaction holds its connection (checked out of the pool) while the link breaks.
    const { transaction, resume } = await heldTransaction();
    await proxy.set("reset");
    // A new connection is reset as well. By the time that fails, the checked-out connection,
    // reset first, has heard of it too: with no query in flight, as an 'error' event only.
    await assert.rejects(works(), isStorageUnavailable, "a new connection is reset too: 503");
    resume();
    await assert.rejects(transaction, isStorageUnavailable, "a query on the broken connection is a 503, not a 500");
    assert.equal((await store.checkWrites())?.kind, "unreachable", "/readyz sees the fault");

    await proxy.set("forward");
    await eventually("queries to work again on the same store", works, { timeoutMs: 10_000 });
    assert.equal(await store.checkWrites(), null, "/readyz is ready again");
    assert.deepEqual(unhandled, [], "no unhandled 'error' event or rejection");
  });

  test("sessions the server terminates (idle, and inside a transaction) cost no unhandled error, and the next query works", async () => {
    await works();
    const { transaction, resume } = await heldTransaction();
    assert.ok((await terminateSessions()) >= 1, "the store's sessions were terminated");
    await eventually("the terminated sessions to be gone", async () => (await sessionCount()) === 0);
    // The idle-in-transaction client hears of it with no query in flight (an 'error' event
    // only), and before a query on a new connection has made its round trips.
    await eventually("the next query to work, on a fresh connection", works, { timeoutMs: 10_000 });
    resume();
    await assert.rejects(transaction, isStorageUnavailable, "the transaction's next query is a 503");
    await works();
    assert.deepEqual(unhandled, [], "no unhandled 'error' event or rejection");
  });

  test("a refused port is a 503 at once, and the store comes back when the port opens", async () => {
    await proxy.set("refuse");
    const started = Date.now();
    await assert.rejects(works(), isStorageUnavailable);
    assert.ok(Date.now() - started < SILENT_BOUND_MS, `a refused connection answers at once (took ${Date.now() - started} ms)`);
    await proxy.set("forward");
    await eventually("queries to work again", works, { timeoutMs: 10_000 });
    assert.deepEqual(unhandled, []);
  });

  test("a silent database (blackhole): a query is a 503 within the deadline, later ones fail at once, /readyz sees it, and all recovers", async () => {
    await works();
    await proxy.set("blackhole");
    let started = Date.now();
    await assert.rejects(works(), isStorageUnavailable, "a query on a silent database ends with a 503");
    const first = Date.now() - started;
    assert.ok(first < SILENT_BOUND_MS, `the first query answered within ${SILENT_BOUND_MS} ms (took ${first} ms; deadline ${POSTGRES_DEADLINES.queryMs} ms)`);
    // The outage is known now: nothing waits on the database until a probe hears it again.
    started = Date.now();
    await assert.rejects(works(), isStorageUnavailable);
    assert.ok(Date.now() - started < POSTGRES_DEADLINES.probeMs, `a query during a known outage fails at once (took ${Date.now() - started} ms)`);
    started = Date.now();
    assert.equal((await store.checkWrites())?.kind, "unreachable", "/readyz says not ready");
    assert.ok(Date.now() - started < SILENT_BOUND_MS, "the readiness check is deadline-bound too");

    await proxy.set("forward");
    await eventually("readiness to come back", async () => (await store.checkWrites()) === null, { timeoutMs: 10_000 });
    await works();
    assert.deepEqual(unhandled, []);
  });

  test("a pool with every connection busy is no outage: the waiting query is a 503, but /readyz stays ready and nothing else fails", async () => {
    await works();
    // Every connection of the pool is checked out, as by slow reports or lock waits.
    const held = [];
    for (let index = 0; index < QUERY_POOL_SIZE; index += 1) held.push(await heldTransaction());
    try {
      await assert.rejects(
        works(),
        (error: unknown) => isStorageUnavailable(error) && (error as StorageUnavailableError).kind === "busy",
        "a query that finds no free connection in time is a 503 that says the pool is busy",
      );
      // The readiness probe runs on a connection of its own, and the wait left no fault behind.
      assert.equal(await store.checkWrites(), null, "/readyz stays ready while the pool is busy");
    } finally {
      for (const { resume } of held) resume();
      await Promise.all(held.map(({ transaction }) => transaction));
    }
    // No outage was declared: the next query goes ahead at once, with no probe to wait for.
    await works();
    assert.deepEqual(unhandled, []);
  });

  test("while every pooled connection is busy, the readiness probe still sees a database that goes silent", async () => {
    await works();
    const held = [];
    for (let index = 0; index < QUERY_POOL_SIZE; index += 1) held.push(await heldTransaction());
    try {
      await proxy.set("blackhole");
      // A probe that waited for a pooled connection would never reach the database at all.
      await eventually("the readiness probe to see the silent database", async () => (await store.checkWrites())?.kind === "unreachable", {
        timeoutMs: 20_000,
      });
    } finally {
      await proxy.set("forward");
      for (const { resume } of held) resume();
      await Promise.allSettled(held.map(({ transaction }) => transaction));
    }
    await eventually("readiness to come back", async () => (await store.checkWrites()) === null, { timeoutMs: 10_000 });
    await works();
    assert.deepEqual(unhandled, []);
  });

  test("a role at its connection limit, with every pooled connection busy, is no outage for the readiness probe", async () => {
    const suffix = randomBytes(4).toString("hex");
    const role = `llmgw_limited_${suffix}`;
    const limitedSchema = `llmgw_test_${suffix}`;
    const target = new URL(TEST_POSTGRES_URL);
    const administer = async (text: string) => {
      const admin = new pg.Client({ connectionString: TEST_POSTGRES_URL });
      await admin.connect();
      try {
        await admin.query(text);
      } finally {
        await admin.end();
      }
    };
    // Room for the pool's connections and no more, as a role limit or max_connections sized to the fleet gives.
    await administer(`create role ${role} login connection limit ${QUERY_POOL_SIZE}`);
    await administer(`grant create on database ${target.pathname.slice(1)} to ${role}`);
    target.username = role;
    const limited = await openStore({ database: target.toString(), schema: limitedSchema });
    try {
      const held = [];
      for (let index = 0; index < QUERY_POOL_SIZE; index += 1) held.push(await heldTransaction(limited));
      try {
        // The probe's own connection is refused (too many connections): the database answered all the same.
        assert.equal(await limited.checkWrites(), null, "/readyz stays ready");
      } finally {
        for (const { resume } of held) resume();
        await Promise.all(held.map(({ transaction }) => transaction));
      }
      await sql`select 1`.execute(limited.db);
    } finally {
      await limited.close();
      await dropSchema(limitedSchema);
      await administer(`drop owned by ${role}`);
      await administer(`drop role ${role}`);
    }
  });

  test("a blackhole that starts between queries is seen by the readiness probe within its deadline", async () => {
    await works();
    await eventually("a probe to run on a healthy store", async () => (await store.checkWrites()) === null);
    await proxy.set("blackhole");
    const started = Date.now();
    await eventually("the readiness probe to see the silent database", async () => (await store.checkWrites())?.kind === "unreachable", { timeoutMs: 20_000 });
    assert.ok(Date.now() - started < SILENT_BOUND_MS, `not ready within ${SILENT_BOUND_MS} ms (took ${Date.now() - started} ms)`);
    await proxy.set("forward");
    await eventually("readiness to come back", async () => (await store.checkWrites()) === null, { timeoutMs: 10_000 });
  });

  test("the change feed and the leadership survive a reset, terminated sessions and a blackhole, reconnect, and log each outage once", async () => {
    const { logger, lines } = capturedLogger();
    const direct = await openStore({ database: TEST_POSTGRES_URL, schema });
    const feed = new ChangeFeed({ store, logger, reconnectMs: 100, heartbeatMs: 500 });
    const leadership = new PostgresLeadership({ store, name: "through-proxy", logger, pollMs: 100 });
    const heard: string[] = [];
    feed.onTold("fault-test", (value) => heard.push(value));
    // Another server that tells (it needs no LISTEN of its own to send).
    const teller = new ChangeFeed({ store: direct, logger });
    const leads: string[] = [];
    try {
      await feed.start();
      await leadership.start({
        lead: async (term) => {
          leads.push(`lead ${term}`);
        },
        standBy: async (why) => {
          leads.push(`stand by: ${why}`);
        },
      });
      assert.equal(leadership.leading, true);
      const hears = async () => {
        const value = randomBytes(4).toString("hex");
        teller.tell("fault-test", value);
        return eventually("the feed to hear another server", () => heard.includes(value), { timeoutMs: 10_000 });
      };
      await hears();

      for (const fault of ["reset", "terminate", "blackhole"] as const) {
        const leadsBefore = leads.length;
        if (fault === "terminate") await terminateSessions();
        else await proxy.set(fault);
        // Told, not polled: after terminated sessions the leader may step down and lead again
        // between two looks at `leading`.
        await eventually(`the leader to step down after ${fault}`, () => leads.slice(leadsBefore).some((entry) => entry.startsWith("stand by")), {
          timeoutMs: 15_000,
        });
        if (fault === "blackhole") await eventually("the feed to drop its silent connection", () => !feed.listening, { timeoutMs: 15_000 });
        await proxy.set("forward");
        await eventually(`the lead to be taken again after ${fault}`, () => leadership.leading, { timeoutMs: 15_000 });
        await eventually(`the feed to listen again after ${fault}`, () => feed.listening, { timeoutMs: 15_000 });
        await hears();
      }
      const count = (text: RegExp) => lines.filter((line) => text.test(line.msg)).length;
      assert.ok(count(/could not listen for other servers' changes|lost the connection that hears/) <= 3, "the feed logs each outage once, not each try");
      assert.ok(count(/could not try for the cluster's leadership/) <= 3, "a standby logs each outage once, not each try");
      assert.deepEqual(unhandled, []);
    } finally {
      await leadership.stop();
      await feed.stop();
      await direct.close();
    }
  });
});

describe("the outage gate", () => {
  const refused = () =>
    new StorageUnavailableError({
      where: "PostgreSQL at postgres://db:5432/llmgw",
      kind: "unreachable",
      faultCode: "ECONNREFUSED",
      cause: new Error("connect ECONNREFUSED 127.0.0.1:5432"),
    });

  test("faults told while the database is down start no probe of their own: the scheduled probe tells when it is back", async () => {
    let probes = 0;
    const gate = new OutageGate({
      health: new StorageHealth(),
      probe: async () => {
        probes += 1;
        throw refused();
      },
    });
    try {
      gate.observe(refused());
      assert.equal(gate.reachability, "doubt", "a refused connection puts the store in doubt and starts a probe");
      // admit() waits for that probe and what follows it: the store is down, the next probe scheduled.
      await assert.rejects(gate.admit(), isStorageUnavailable);
      assert.equal(gate.reachability, "down");
      assert.equal(probes, 1);
      // Usage flushes and drains name their faults (Store.nameFault) however often they run.
      for (let told = 0; told < 5; told += 1) gate.observe(refused());
      assert.equal(probes, 1, "faults told while down start no probe");
      await eventually("the scheduled probe to run", () => probes >= 2, { timeoutMs: 10_000 });
    } finally {
      gate.close();
    }
  });
});
