// The parts that let several servers share one PostgreSQL, each against a real database:
// joining (secrets and names checked against the live members), the leadership (one
// leader, a standby taking over when its session ends, a stale leader's writes refused by
// the term), and the change feed (other servers' writes heard, other schemas not heard).
// How soon a write is heard is a latency: bench/cluster/change-feed.ts measures it.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { randomBytes } from "node:crypto";
import pg from "pg";
import { sql } from "kysely";
import { AuthenticationError } from "../core/errors.ts";
import { silentLogger } from "../core/log.ts";
import { SecretBox } from "../core/secret-box.ts";
import { openStore, type Store } from "../store/store.ts";
import { dropSchema, postgresSchemaOrSkip, testBothStores, TEST_POSTGRES_URL } from "../../test/support/stores.ts";
import { eventually } from "../../test/support/eventually.ts";
import { ClusterMembers } from "./cluster-members.ts";
import { loadClusterSecret } from "./cluster-secret.ts";
import { NotLeaderError, PostgresLeadership, type LeadershipListener } from "./leadership.ts";
import { ChangeFeed, type FollowedTable } from "./change-feed.ts";
import { ServerRole } from "./server-role.ts";
import { KeyService } from "../keys/key-service.ts";
import { writeTinyLlamaGguf } from "../gguf/tiny-model.ts";
import { startHarness, type Harness } from "../../test/support/server-harness.ts";

const logger = silentLogger();
const secretA = loadClusterSecret({ env: "a".repeat(40), dataDirBox: () => SecretBox.fromKey(randomBytes(32)) }).box;
const secretB = loadClusterSecret({ env: "b".repeat(40), dataDirBox: () => SecretBox.fromKey(randomBytes(32)) }).box;

function member(store: Store, name: string, box: SecretBox, options: { dataDir?: string; clock?: () => number; beatMs?: number; liveMs?: number } = {}) {
  const dataDir = options.dataDir ?? mkdtempSync(path.join(tmpdir(), "llmgw-member-"));
  return new ClusterMembers({
    store,
    dataDir,
    self: { name, url: `http://${name}.example:8700`, version: "test", secretCheck: box.checkValue(), secretSource: "LLMGW_CLUSTER_SECRET" },
    logger,
    ...(options.clock === undefined ? {} : { clock: options.clock }),
    ...(options.beatMs === undefined ? {} : { beatMs: options.beatMs }),
    ...(options.liveMs === undefined ? {} : { liveMs: options.liveMs }),
  });
}

/**
 * Time passes by `ms` with no member beating: SQLite's members go by the test's clock; on
 * PostgreSQL, whose clock judges ages there, every member's last stamp moves back instead.
 */
async function noBeatsFor(store: Store, ms: number, advanceClock: (ms: number) => void): Promise<void> {
  if (store.dialect !== "postgres") return advanceClock(ms);
  const earlier = sql<string>`to_char(now() at time zone 'utc' - make_interval(secs => ${ms / 1000}), 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')`;
  await store.db.updateTable("cluster_members").set({ last_seen: earlier }).execute();
}

test("a cluster secret is derived the same from the same text, differs from another, and is refused when short", () => {
  const again = loadClusterSecret({ env: ` ${"a".repeat(40)}\n`, dataDirBox: () => SecretBox.fromKey(randomBytes(32)) }).box;
  assert.equal(again.checkValue(), secretA.checkValue());
  assert.notEqual(secretA.checkValue(), secretB.checkValue());
  assert.equal(again.open(secretA.seal("engine-key")), "engine-key", "one server opens what another sealed");
  assert.equal(secretB.open(secretA.seal("engine-key")), null);
  assert.throws(
    () => loadClusterSecret({ env: "short", dataDirBox: () => secretA }),
    /has 5 characters; it needs at least 32\. Make one with 'openssl rand -base64 48'/,
  );
  const fromDataDir = loadClusterSecret({ dataDirBox: () => secretB });
  assert.equal(fromDataDir.source, "data dir");
});

testBothStores("joining refuses a live server with another secret or the same name, and takes over from one that is gone", async (store) => {
  let now = Date.parse("2026-12-01T10:00:00Z");
  const clock = () => now;
  const dirs: string[] = [];
  const dir = () => {
    const made = mkdtempSync(path.join(tmpdir(), "llmgw-member-"));
    dirs.push(made);
    return made;
  };
  try {
    // No beats of their own (on PostgreSQL): the test says when time passes without them.
    const quiet = 3_600_000;
    const a = member(store, "a", secretA, { clock, dataDir: dir(), beatMs: quiet });
    await a.join();
    const intruder = member(store, "c", secretB, { clock, dataDir: dir() });
    await assert.rejects(intruder.join(), (error: Error & { code?: string }) => {
      assert.equal(error.code, "cluster_secret_mismatch");
      assert.match(error.message, /differs from that of the running server 'a' \(http:\/\/a\.example:8700\)/);
      return true;
    });
    const twin = member(store, "a", secretA, { clock, dataDir: dir() });
    await assert.rejects(
      twin.join(),
      /Another server named 'a' runs on this database \(http:\/\/a\.example:8700, last seen .*\)\. Give each server its own name with --server-name/,
    );
    const b = member(store, "b", secretA, { clock, dataDir: dir(), beatMs: quiet });
    await b.join();
    assert.deepEqual(
      (await b.list()).map((m) => [m.name, m.live]),
      [
        ["a", true],
        ["b", true],
      ],
    );

    // a stops cleanly; then b's secret changes nothing for a server started with another one once no live member has b's.
    await a.leave();
    await noBeatsFor(store, 11_000, (ms) => {
      now += ms;
    });
    assert.deepEqual(
      (await b.list()).map((m) => [m.name, m.live]),
      [
        ["a", false],
        ["b", true],
      ],
      "a, not seen for 11 s, is gone; b itself runs",
    );
    await member(store, "c", secretB, { clock, dataDir: dir(), beatMs: quiet }).join();
    // A restart of the same server (same data dir) takes its name back even while its old row looks alive.
    const sameDir = dir();
    await member(store, "d", secretB, { clock, dataDir: sameDir, beatMs: quiet }).join();
    await member(store, "d", secretB, { clock, dataDir: sameDir, beatMs: quiet }).join();
  } finally {
    for (const made of dirs) rmSync(made, { recursive: true, force: true });
  }
});

test("on PostgreSQL a server whose clock is an hour ahead still sees the others live, and one that stopped beating is gone after the window", async (t) => {
  const database = await postgresSchemaOrSkip(t);
  if (database === null) return;
  const store = await openStore(database);
  const dirs = [0, 1, 2].map(() => mkdtempSync(path.join(tmpdir(), "llmgw-member-")));
  const hourAhead = () => Date.now() + 3_600_000;
  const liveMs = 3_000;
  try {
    // a beats every 200 ms; b, an hour ahead, judges it; c beats once (at join) and then no more.
    const a = member(store, "a", secretA, { dataDir: dirs[0], beatMs: 200, liveMs });
    const b = member(store, "b", secretA, { dataDir: dirs[1], clock: hourAhead, beatMs: 200, liveMs });
    const c = member(store, "c", secretA, { dataDir: dirs[2], beatMs: 3_600_000, liveMs });
    await a.join();
    await b.join();
    await c.join();
    const liveness = async (judge: ClusterMembers) => (await judge.list()).map((m) => [m.name, m.live]);
    assert.deepEqual(
      await liveness(b),
      [
        ["a", true],
        ["b", true],
        ["c", true],
      ],
      "b's clock, an hour ahead, does not make the others look gone",
    );
    assert.deepEqual(
      await liveness(a),
      [
        ["a", true],
        ["b", true],
        ["c", true],
      ],
      "nor does b look gone (or an hour in the future) to a",
    );
    const stamped = await store.db.selectFrom("cluster_members").select("last_seen").where("name", "=", "b").executeTakeFirstOrThrow();
    assert.ok(Date.parse(stamped.last_seen) < Date.now() + 600_000, `b's stamp is the database's clock, not b's own (${stamped.last_seen})`);
    // c stopped beating: past the window it is gone, to b as to a; a and b, still beating, stay live.
    await eventually(
      "c gone to b",
      async () =>
        JSON.stringify(await liveness(b)) ===
        JSON.stringify([
          ["a", true],
          ["b", true],
          ["c", false],
        ]),
    );
    assert.deepEqual(await liveness(a), [
      ["a", true],
      ["b", true],
      ["c", false],
    ]);
    await a.leave();
    await b.leave();
  } finally {
    await store.close();
    await dropSchema(database.schema);
    for (const made of dirs) rmSync(made, { recursive: true, force: true });
  }
});

/** A store on a fresh schema, and a second connection to the same schema (another server). */
async function twoServersOnOneSchema(t: Parameters<typeof postgresSchemaOrSkip>[0]): Promise<{ a: Store; b: Store; cleanup: () => Promise<void> } | null> {
  const database = await postgresSchemaOrSkip(t);
  if (database === null) return null;
  const a = await openStore(database);
  const b = await openStore(database);
  return {
    a,
    b,
    cleanup: async () => {
      await a.close();
      await b.close();
      await dropSchema(database.schema);
    },
  };
}

/** Ends the session holding the leader's advisory lock of this schema, from outside (as a network cut would). */
async function terminateLeaderSession(schema: string): Promise<void> {
  const killer = new pg.Client({ connectionString: TEST_POSTGRES_URL });
  await killer.connect();
  try {
    const ended = await killer.query(
      "select pg_terminate_backend(pid) as ended from pg_locks where locktype = 'advisory' and granted and classid = $1 and objsubid = 2 and objid::bigint = (hashtext($2)::bigint & 4294967295)",
      [0x6c6c, schema],
    );
    assert.equal(ended.rowCount, 1, "one leader session of this schema");
  } finally {
    await killer.end();
  }
}

function recordingListener() {
  const seen: string[] = [];
  const listener: LeadershipListener = {
    lead: async (term, previous) => {
      seen.push(`lead ${term} after ${previous ?? "none"}`);
    },
    standBy: async (why) => {
      seen.push(`stand by: ${why}`);
    },
  };
  return { seen, listener };
}

test("one leader; a standby takes over when the leader's session ends, and the old leader's writes are refused", async (t) => {
  const stores = await twoServersOnOneSchema(t);
  if (stores === null) return;
  const a = new PostgresLeadership({ store: stores.a, name: "a", logger, pollMs: 50 });
  // b polls as often as a: while a leads it must not get the lock however often it tries.
  const b = new PostgresLeadership({ store: stores.b, name: "b", logger, pollMs: 50 });
  const la = recordingListener();
  const lb = recordingListener();
  try {
    await a.start(la.listener);
    await b.start(lb.listener);
    assert.equal(a.leading, true);
    assert.equal(a.term, 1);
    assert.equal(b.leading, false);
    await a.write((trx) => trx.insertInto("cluster_settings").values({ name: "x", value: "by a", updated_at: "now" }).execute());
    await assert.rejects(
      b.write(async () => undefined),
      NotLeaderError,
      "a standby cannot write as the leader",
    );

    // a goes away (its session ends, as a killed process's does): b takes over with the next term.
    await a.stop();
    await eventually("b to lead", () => b.leading);
    assert.equal(b.term, 2);
    assert.deepEqual(lb.seen, ["lead 2 after a"]);
    assert.deepEqual(la.seen, ["lead 1 after none", "stand by: the server is stopping"]);
    await assert.rejects(
      a.write(async () => undefined),
      NotLeaderError,
      "a gone leader cannot write",
    );
    await b.write((trx) => trx.updateTable("cluster_settings").set({ value: "by b" }).where("name", "=", "x").execute());

    // b's session is cut from outside (a network cut): b steps down at once, and leads again with a new term.
    await terminateLeaderSession(stores.b.schema!);
    await eventually("b to lead again", () => b.term === 3);
    assert.match(lb.seen[1]!, /^stand by: its PostgreSQL session (ended|was lost)/);
    assert.equal(lb.seen[2], "lead 3 after b");
  } finally {
    await a.stop();
    await b.stop();
    await stores.cleanup();
  }
});

test("a leader that has not noticed it lost the lead has its write refused by the fencing term", async (t) => {
  const stores = await twoServersOnOneSchema(t);
  if (stores === null) return;
  // a checks its session only once an hour: it cannot notice in time.
  const a = new PostgresLeadership({ store: stores.a, name: "a", logger, pollMs: 3_600_000 });
  const la = recordingListener();
  try {
    await a.start(la.listener);
    assert.equal(a.term, 1);
    // Another server took the lead meanwhile (after a's session was lost and found again, say): the term moved on.
    await stores.b.db.updateTable("cluster_leader").set({ term: 2, leader: "b" }).where("id", "=", 1).execute();
    assert.equal(a.leading, true, "a has not noticed");
    let ran = false;
    await assert.rejects(
      a.write(async () => {
        ran = true;
      }),
      (error: Error) => {
        assert.ok(error instanceof NotLeaderError);
        assert.match(error.message, /no longer leads the cluster \(term 2 is another server's\)/);
        return true;
      },
    );
    assert.equal(ran, false, "the write itself never ran");
    await eventually("a to step down after the refused write", () => !a.leading);
    assert.match(la.seen.at(-1)!, /stand by: another server leads now \(term 2, this server had 1\)/);
  } finally {
    await a.stop();
    await stores.cleanup();
  }
});

test("the change feed tells a server of another's writes, not of other schemas', and carries messages", async (t) => {
  const stores = await twoServersOnOneSchema(t);
  if (stores === null) return;
  const other = await postgresSchemaOrSkip(t);
  const elsewhere = other === null ? null : await openStore(other);
  const feed = new ChangeFeed({ store: stores.b, logger, resyncMs: 3_600_000 });
  const heard: Array<ReadonlySet<FollowedTable>> = [];
  const notified: boolean[] = [];
  const told: string[] = [];
  try {
    feed.subscribe(["console_sessions", "models"], (tables, cause) => {
      heard.push(tables);
      notified.push(cause.notified);
    });
    feed.onTold("demand", (value) => told.push(value));
    await feed.start();
    // The first (re)connect resyncs everything once.
    await eventually("the start's resync", () => heard.length === 1);
    assert.deepEqual(notified, [false], "a resync is not a notified change");
    heard.length = 0;
    notified.length = 0;
    await elsewhere!.db.insertInto("cluster_settings").values({ name: "elsewhere", value: "v", updated_at: "now" }).execute();
    // A write in another schema of the same database is not this cluster's news. It is a
    // table b follows (models) and it commits before a's write below; PostgreSQL delivers
    // notices in commit order, so had b taken it for its own, 'models' would be heard no
    // later than a's write (in an earlier call, or in the same one). No wait is needed.
    const at = "2026-12-01T10:00:00.000Z";
    await elsewhere!.db
      .insertInto("models")
      .values({ id: "m-elsewhere", name: "elsewhere", definition: "{}", created_by: "t", created_at: at, updated_by: "t", updated_at: at })
      .execute();
    await stores.a.db.insertInto("console_sessions").values({ id: "s1", key_id: "k", key_hash: "h", created_at: "now", expires_at: "later" }).execute();
    await eventually("b to hear a's write", () => heard.length > 0);
    assert.deepEqual(
      heard.map((tables) => [...tables]),
      [["console_sessions"]],
      "one call, for the table written in this schema only: the other schema's models write is not heard",
    );
    assert.deepEqual(notified, [true], "told apart from a resync (a key cache trusts its entries less after one)");
    const aFeed = new ChangeFeed({ store: stores.a, logger });
    aFeed.tell("demand", "model-1");
    await eventually("the message", () => told.length === 1);
    assert.deepEqual(told, ["model-1"]);
  } finally {
    await feed.stop();
    await elsewhere?.close();
    if (other !== null) await dropSchema(other.schema);
    await stores.cleanup();
  }
});

test("a key revoked through one server is refused by another through the change feed, not at the end of its cache's TTL", async (t) => {
  const stores = await twoServersOnOneSchema(t);
  if (stores === null) return;
  // The key services' clock stands still, so b's cached key never ages out: only the feed
  // can make b look the key up again.
  const clock = () => Date.parse("2026-12-01T10:00:00Z");
  const keysA = new KeyService({ store: stores.a, clock });
  const keysB = new KeyService({ store: stores.b, clock });
  const feed = new ChangeFeed({ store: stores.b, logger, resyncMs: 3_600_000 });
  // As src/server/server.ts wires it.
  feed.subscribe(["api_keys"], (_tables, { notified }) => keysB.forgetCached(notified ? "notified" : "resync"));
  try {
    await feed.start();
    const { key, info } = await keysA.create({ name: "short-lived" }, "test");
    assert.equal((await keysB.verify(key)).keyId, info.id, "b has verified (and cached) the key");
    await keysA.revoke(info.id, "test");
    await eventually("b to refuse the revoked key", () =>
      keysB.verify(key).then(
        () => false,
        (error: unknown) => error instanceof AuthenticationError,
      ),
    );
  } finally {
    await feed.stop();
    await stores.cleanup();
  }
});

test("a server that stands by while its services start ends with none running; one stopping takes no lead", async () => {
  const started: string[] = [];
  let releaseJobs: (() => void) | undefined;
  const services = {
    jobs: {
      recover: async () => undefined,
      start: () => new Promise<void>((resolve) => (releaseJobs = resolve)),
      close: async () => void started.push("jobs closed"),
    },
    updates: { start: () => void started.push("updates"), stop: () => void started.push("updates stopped") },
    budgetAlerts: { start: async () => void started.push("alerts"), stop: async () => void started.push("alerts stopped") },
    notifier: { start: async () => void started.push("notifier"), stop: async () => void started.push("notifier stopped") },
    usageRetention: { start: () => void started.push("retention"), stop: async () => void started.push("retention stopped") },
  };
  const fleets: string[] = [];
  const fakeFleet = () => ({ start: async () => void fleets.push("started"), settled: async () => undefined, stop: async () => void fleets.push("stopped") });
  const role = new ServerRole({ makeFleet: fakeFleet as never, services: services as never, follower: null, name: "a", logger });
  await role.lead(1, null);
  const serving = role.serve();
  const standingBy = role.standBy("another server leads now");
  // The stand-by comes while the jobs are starting.
  await eventually("the jobs to be starting", () => releaseJobs !== undefined);
  releaseJobs!();
  await Promise.all([serving, standingBy]);
  assert.deepEqual(
    started,
    ["updates", "alerts", "notifier", "retention", "updates stopped", "alerts stopped", "notifier stopped", "jobs closed", "retention stopped"],
    "each service started before the stand-by is stopped by it",
  );
  assert.equal(role.fleet, null);
  await role.closingDown();
  await role.lead(2, "b");
  assert.equal(role.fleet, null, "a server stopping takes up no lead");
  assert.deepEqual(fleets, ["started", "stopped"]);
});

test("mirror fetches through any server run on the leader, or on the --mirror-on server; a standby forwards the fleet's requests", async (t) => {
  const database = await postgresSchemaOrSkip(t);
  if (database === null) return;
  const weights = path.join(mkdtempSync(path.join(tmpdir(), "llmgw-weights-")), "tiny.gguf");
  await writeTinyLlamaGguf({ path: weights, seed: 5 });
  const started: Harness[] = [];
  try {
    const a = await startHarness({ database, cluster: { name: "a" } });
    started.push(a);
    const b = await startHarness({ database, adminKey: a.adminKey, cluster: { name: "b" } });
    started.push(b);
    const holders = async (model: string) =>
      eventually(`${model} complete`, async () => {
        const files = (await b.admin("GET", `/api/v1/mirror?model=${model}`)).body.data as Array<{ state: string; holders: string[] }>;
        return files.length > 0 && files.every((f) => f.state === "complete") ? files.flatMap((f) => f.holders) : undefined;
      });
    // a leads: a fetch asked of b runs on a.
    assert.equal((await b.admin("POST", "/api/v1/mirror", { repo: weights, model: "on-leader" })).status, 202);
    assert.deepEqual(await holders("on-leader"), ["a"]);
    // The fleet's reads are the leader's too: b answers with a's nodes and plan.
    assert.equal((await b.admin("GET", "/api/v1/nodes")).status, 200);

    // A third server told to mirror on b: its fetches go to b, wherever asked.
    const c = await startHarness({ database, adminKey: a.adminKey, cluster: { name: "c", mirrorOn: "b" } });
    started.push(c);
    assert.equal((await c.admin("POST", "/api/v1/mirror", { repo: weights, model: "on-b" })).status, 202);
    assert.deepEqual(await holders("on-b"), ["b"]);
  } finally {
    for (const harness of started.reverse()) await harness.close();
    await dropSchema(database.schema);
  }
});
