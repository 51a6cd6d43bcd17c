// The per-minute aggregates on both databases: what the usage recorder's flush adds up,
// what two servers' flushes into one database add up to, what the report reads back
// (groups, periods, percentiles against known latencies), and what retention keeps.
import { test } from "node:test";
import assert from "node:assert/strict";
import { UsageRecorder, type UsageRow } from "../gateway/usage-recorder.ts";
import { openStore } from "../store/store.ts";
import { testBothDatabases, testBothStores } from "../../test/support/stores.ts";
import { bucketOf, bucketValue, percentile } from "./latency-histogram.ts";
import { queryUsage, readPlan, type UsageQuery } from "./usage-query.ts";
import { UsageRetention, AGGREGATE_RETENTION_DAYS } from "./usage-retention.ts";

const row = (fields: Partial<UsageRow> & { at: string }): UsageRow => ({
  key_id: "key-a",
  model: "tiny",
  replica_id: "r1",
  endpoint: "/v1/chat/completions",
  prompt_tokens: 10,
  completion_tokens: 5,
  ttft_ms: null,
  duration_ms: 100,
  status: 200,
  stream: 0,
  cost_usd: 0.001,
  guard_ms: null,
  ...fields,
});

const names = new Map([
  ["key-a", "alice"],
  ["key-b", "bob"],
]);
const keyName = (id: string) => names.get(id) ?? id;
const everything = (groupBy: UsageQuery["groupBy"], extra: Partial<UsageQuery> = {}): UsageQuery => ({
  from: "2026-11-01T00:00:00Z",
  to: "2026-12-01T00:00:00Z",
  keyIds: null,
  model: null,
  groupBy,
  ...extra,
});

/** What a percentile of these exact latencies reads back as, within the histogram's error bound. */
const withinBound = (actual: number | null, exact: number, what: string) => {
  assert.ok(actual !== null, `${what} is known`);
  assert.ok(Math.abs(actual - exact) <= exact * 0.045 + 0.5, `${what}: ${actual} is within 4.4% of ${exact}`);
};

test("a latency comes back from its bucket within 4.4%, and exactly below 12 ms", () => {
  for (let ms = 0; ms < 12; ms += 1) assert.equal(bucketValue(bucketOf(ms)), ms);
  for (let ms = 12; ms < 4_000_000; ms = Math.ceil(ms * 1.013)) withinBound(bucketValue(bucketOf(ms)), ms, `${ms} ms`);
  assert.equal(percentile({}, 0.5), null, "no observations, no percentile");
});

testBothStores("a flush adds raw rows and per-minute aggregates; a second flush into the same minute adds to them", async (store) => {
  const usage = new UsageRecorder({ store });
  // Two flushes of the same minute, key and model: the durations 10..100 ms, half in each.
  for (let i = 1; i <= 5; i += 1) usage.record(row({ at: `2026-11-30T10:00:0${i}.000Z`, duration_ms: i * 10, ttft_ms: i * 3, stream: 1 }));
  usage.record(
    row({
      at: "2026-11-30T10:01:00.000Z",
      key_id: "key-b",
      model: "other",
      status: 503,
      prompt_tokens: null,
      completion_tokens: null,
      cost_usd: null,
      duration_ms: 7,
    }),
  );
  await usage.flush();
  for (let i = 6; i <= 10; i += 1) usage.record(row({ at: `2026-11-30T10:00:${10 + i}.000Z`, duration_ms: i * 10, guard_ms: 4 }));
  usage.record(row({ at: "2026-11-30T11:59:59.999Z", duration_ms: 1000, status: 499, prompt_tokens: 3, completion_tokens: 0, cost_usd: 0.0005 }));
  await usage.close();

  const raw = await store.db.selectFrom("usage").select(["cost_usd", "guard_ms"]).where("guard_ms", "is not", null).execute();
  assert.equal(raw.length, 5, "guard_ms is written on the raw rows");
  assert.ok(
    raw.every((r) => r.cost_usd === 0.001 && r.guard_ms === 4),
    "and cost_usd",
  );

  const minutes = await store.db.selectFrom("usage_minutes").selectAll().orderBy("minute").orderBy("key_id").execute();
  assert.deepEqual(
    minutes.map((m) => [m.minute, m.key_id, m.model, Number(m.requests), Number(m.errors), Number(m.prompt_tokens), Number(m.completion_tokens)]),
    [
      ["2026-11-30T10:00:00.000Z", "key-a", "tiny", 10, 0, 100, 50],
      ["2026-11-30T10:01:00.000Z", "key-b", "other", 1, 1, 0, 0],
      ["2026-11-30T11:59:00.000Z", "key-a", "tiny", 1, 1, 3, 0],
    ],
  );

  const [tiny] = (await queryUsage(store, everything([], { keyIds: ["key-a"], to: "2026-11-30T10:01:00Z" }), keyName)).rows;
  assert.ok(tiny);
  assert.equal(tiny.requests, 10);
  assert.equal(tiny.cost_usd, 0.01);
  // Nearest rank of 10..100 ms: p50 is the 5th (50 ms), p95 the 10th (100 ms); the ttft of the streams 3..15 ms, p50 9 ms (exact below 12 ms).
  withinBound(tiny.p50_ms, 50, "p50");
  withinBound(tiny.p95_ms, 100, "p95");
  assert.equal(tiny.ttft_p50_ms, 9);
  assert.deepEqual({ key: tiny.key, model: tiny.model, period: tiny.period }, { key: null, model: null, period: null }, "fields not grouped by are null");
});

testBothStores("per minute, whole hours are read from the minutes too", async (store) => {
  const usage = new UsageRecorder({ store });
  usage.record(row({ at: "2026-11-30T09:59:30.000Z" }));
  usage.record(row({ at: "2026-11-30T10:05:10.000Z" }));
  usage.record(row({ at: "2026-11-30T10:05:50.000Z", key_id: "key-b" }));
  usage.record(row({ at: "2026-11-30T11:30:00.000Z", status: 500 }));
  await usage.close();
  const byMinute = (await queryUsage(store, everything(["minute"], { from: "2026-11-30T09:00:00Z", to: "2026-11-30T12:00:00Z" }), keyName)).rows;
  assert.deepEqual(
    byMinute.map((r) => [r.period, r.requests, r.errors]),
    [
      ["2026-11-30T09:59:00.000Z", 1, 0],
      ["2026-11-30T10:05:00.000Z", 2, 0],
      ["2026-11-30T11:30:00.000Z", 1, 1],
    ],
  );
});

testBothStores("the report groups by key, model, hour and day, sorted by period then key and model", async (store) => {
  const usage = new UsageRecorder({ store });
  usage.record(row({ at: "2026-11-29T23:30:00.000Z", key_id: "key-b", model: "tiny" }));
  usage.record(row({ at: "2026-11-30T10:05:00.000Z", key_id: "key-b", model: "tiny" }));
  usage.record(row({ at: "2026-11-30T10:06:00.000Z", key_id: "key-a", model: "tiny" }));
  usage.record(row({ at: "2026-11-30T11:00:00.000Z", key_id: "key-a", model: "big", status: 500 }));
  await usage.close();

  const byDayKey = (await queryUsage(store, everything(["day", "key"]), keyName)).rows;
  assert.deepEqual(
    byDayKey.map((r) => [r.period, r.key, r.model, r.requests, r.errors]),
    [
      ["2026-11-29T00:00:00.000Z", "bob", null, 1, 0],
      ["2026-11-30T00:00:00.000Z", "alice", null, 2, 1],
      ["2026-11-30T00:00:00.000Z", "bob", null, 1, 0],
    ],
  );
  const byHourModel = (await queryUsage(store, everything(["model", "hour"], { from: "2026-11-30T00:00:00Z" }), keyName)).rows;
  assert.deepEqual(
    byHourModel.map((r) => [r.period, r.key, r.model, r.requests]),
    [
      ["2026-11-30T10:00:00.000Z", null, "tiny", 2],
      ["2026-11-30T11:00:00.000Z", null, "big", 1],
    ],
  );
  const oneModel = (await queryUsage(store, everything(["key"], { model: "tiny", keyIds: ["key-b"] }), keyName)).rows;
  assert.deepEqual(
    oneModel.map((r) => [r.key, r.requests, r.prompt_tokens, r.completion_tokens]),
    [["bob", 2, 20, 10]],
  );
  const none = await queryUsage(store, everything(["key"], { keyIds: [] }), keyName);
  assert.deepEqual(none.rows, [], "a key list that matched nothing reports nothing");
  assert.equal(none.total.requests, 0);
});

testBothDatabases("two servers flushing into one database add up, histograms included", async (database) => {
  const first = await database.open();
  const second = await database.open();
  try {
    const a = new UsageRecorder({ store: first });
    const b = new UsageRecorder({ store: second });
    // One server saw the fast half (20..39 ms), the other the slow half (40..59 ms): the
    // percentiles come out right only when both histograms are merged.
    for (let i = 0; i < 40; i += 1) {
      (i < 20 ? a : b).record(row({ at: `2026-11-30T10:00:${String(i).padStart(2, "0")}.000Z`, duration_ms: 20 + i }));
    }
    await Promise.all([a.close(), b.close()]);
    const [total] = (await queryUsage(first, everything([]), keyName)).rows;
    assert.equal(total?.requests, 40);
    assert.equal(total?.prompt_tokens, 400);
    // Durations 20..59: nearest-rank p50 is the 20th (39 ms), p95 the 38th (57 ms).
    withinBound(total!.p50_ms, 39, "p50 of both servers' requests");
    withinBound(total!.p95_ms, 57, "p95 of both servers' requests");
  } finally {
    await first.close();
    await second.close();
  }
});

testBothStores("retention deletes raw rows past their days and keeps the aggregates, which still answer", async (store) => {
  const now = Date.parse("2026-11-30T12:00:00Z");
  const daysAgo = (days: number) => new Date(now - days * 86_400_000).toISOString();
  const usage = new UsageRecorder({ store });
  usage.record(row({ at: daysAgo(31), duration_ms: 40 }));
  usage.record(row({ at: daysAgo(1), duration_ms: 80 }));
  usage.record(row({ at: daysAgo(AGGREGATE_RETENTION_DAYS + 1) }));
  await usage.close();

  const retention = new UsageRetention({ store, retentionDays: 30, clock: () => now });
  assert.deepEqual(await retention.sweep(), { rows: 2, aggregates: 1, hourly: 1 });
  const left = await store.db.selectFrom("usage").select("at").execute();
  assert.deepEqual(
    left.map((r) => r.at),
    [daysAgo(1)],
  );
  const month = (await queryUsage(store, everything([], { from: daysAgo(60), to: daysAgo(0) }), keyName)).rows;
  assert.equal(month[0]?.requests, 2, "the month-old request is still counted from its aggregate");
  withinBound(month[0]!.p50_ms, 40, "p50 over a deleted row");
  assert.deepEqual(await retention.sweep(), { rows: 0, aggregates: 0, hourly: 0 }, "a second sweep finds nothing");

  // Deletes go a slice at a time (a few thousand rows in production): the result is the same.
  const sliced = new UsageRecorder({ store });
  for (let day = 2; day <= 6; day += 1) sliced.record(row({ at: daysAgo(AGGREGATE_RETENTION_DAYS + day) }));
  for (let day = 40; day <= 44; day += 1) sliced.record(row({ at: daysAgo(day) }));
  await sliced.close();
  assert.deepEqual(await new UsageRetention({ store, retentionDays: 30, clock: () => now, sliceRows: 2 }).sweep(), { rows: 10, aggregates: 5, hourly: 5 });
  assert.equal((await store.db.selectFrom("usage_minutes").select("minute").where("minute", "<", daysAgo(AGGREGATE_RETENTION_DAYS)).execute()).length, 0);
  assert.equal((await store.db.selectFrom("usage_hours").select("hour").where("hour", "<", daysAgo(AGGREGATE_RETENTION_DAYS)).execute()).length, 0);

  const forever = new UsageRetention({ store, retentionDays: 0, clock: () => now + 1000 * 86_400_000 });
  assert.equal((await forever.sweep()).rows, 0, "0 days keeps raw rows forever");
});

testBothStores("the time to first token counts streamed requests only", async (store) => {
  const usage = new UsageRecorder({ store });
  // The gateway times the first byte of every answer; a whole JSON answer's is its duration.
  for (let i = 0; i < 5; i += 1) usage.record(row({ at: `2026-11-30T10:00:0${i}.000Z`, stream: 0, ttft_ms: 900, duration_ms: 900 }));
  for (let i = 0; i < 3; i += 1) usage.record(row({ at: `2026-11-30T10:00:1${i}.000Z`, stream: 1, ttft_ms: 5, duration_ms: 900 }));
  await usage.close();
  const { rows } = await queryUsage(store, everything([]), keyName);
  assert.equal(rows[0]?.requests, 8);
  assert.equal(rows[0]?.ttft_p50_ms, 5, "the p50 of the three streams, not pulled up by the five JSON answers");
  const hour = await store.db.selectFrom("usage_hours").select("ttft_hist").executeTakeFirstOrThrow();
  assert.deepEqual(JSON.parse(hour.ttft_hist), { [String(bucketOf(5))]: 3 }, "the hourly rollup too");
});

testBothStores(
  "a range of whole hours reads the hourly rollups and its partial hours the minutes, a page at a time, with a total of all rows",
  async (store) => {
    const usage = new UsageRecorder({ store, maxBatch: 10_000 });
    // 1100 keys in 10:00-10:59 (more aggregates than one page), one request each, plus
    // requests at 09:59 and 11:00 at the edges of the range asked for below.
    for (let i = 0; i < 1100; i += 1)
      usage.record(row({ at: `2026-11-30T10:${String(i % 60).padStart(2, "0")}:00.000Z`, key_id: `key-${i}`, duration_ms: 10 + (i % 50) }));
    usage.record(row({ at: "2026-11-30T09:59:30.000Z", duration_ms: 1 }));
    usage.record(row({ at: "2026-11-30T09:30:00.000Z", duration_ms: 1 }));
    usage.record(row({ at: "2026-11-30T11:00:10.000Z", duration_ms: 3000 }));
    usage.record(row({ at: "2026-11-30T11:30:00.000Z", duration_ms: 3000 }));
    await usage.close();
    assert.equal((await store.db.selectFrom("usage_hours").select("hour").execute()).length, 1100 + 2, "one hourly row per key and hour");

    const range = everything(["hour"], { from: "2026-11-30T09:59:00Z", to: "2026-11-30T11:01:00Z" });
    // Drop the minutes of the whole hour 10:00: the report must still count them, from the hourly rollup.
    await store.db.deleteFrom("usage_minutes").where("minute", ">=", "2026-11-30T10:00:00.000Z").where("minute", "<", "2026-11-30T11:00:00.000Z").execute();
    const report = await queryUsage(store, range, keyName);
    assert.deepEqual(
      report.rows.map((r) => [r.period, r.requests]),
      [
        ["2026-11-30T09:00:00.000Z", 1],
        ["2026-11-30T10:00:00.000Z", 1100],
        ["2026-11-30T11:00:00.000Z", 1],
      ],
      "09:59 and 11:00 from the minutes (not 09:30 or 11:30, outside the range), 10:00-10:59 from the hour",
    );
    assert.equal(report.total.requests, 1102);
    assert.equal(report.total.prompt_tokens, 11_020);
    assert.deepEqual([report.total.key, report.total.model, report.total.period], [null, null, null]);
    // Nearest rank over all 1102: the 1 ms and 3000 ms requests sit at the two ends.
    withinBound(report.total.p50_ms, 34, "p50 of every request in the range");
    assert.equal(report.total.p95_ms !== null && report.total.p95_ms < 100, true, "p95 is not the single 3000 ms request");
    const byKey = await queryUsage(store, everything(["key"], { from: "2026-11-30T10:00:00Z", to: "2026-11-30T11:00:00Z" }), keyName);
    assert.equal(byKey.rows.length, 1100, "every key's row arrives across the pages");
    assert.equal(new Set(byKey.rows.map((r) => r.key)).size, 1100);
  },
);

test("the read plan takes whole hours from the rollups and the partial hours from the minutes", () => {
  const at = (iso: string) => Date.parse(iso);
  const plan = (from: string, to: string) =>
    readPlan(at(from), at(to)).map((p) => [p.granularity, new Date(p.from).toISOString().slice(11, 16), new Date(p.to).toISOString().slice(11, 16)]);
  assert.deepEqual(plan("2026-11-30T09:59:00Z", "2026-11-30T12:01:00Z"), [
    ["minute", "09:59", "10:00"],
    ["hour", "10:00", "12:00"],
    ["minute", "12:00", "12:01"],
  ]);
  assert.deepEqual(plan("2026-11-30T10:00:00Z", "2026-11-30T12:00:00Z"), [["hour", "10:00", "12:00"]]);
  assert.deepEqual(plan("2026-11-30T10:10:00Z", "2026-11-30T11:20:00Z"), [["minute", "10:10", "11:20"]], "no whole hour inside: minutes only");
});

testBothDatabases("migration 0008 adds up the usage rows an older llmgw wrote, across pages, histograms included", async (database) => {
  // The database as llmgw left it before 0008: raw rows only, without cost_usd or guard_ms.
  const older = await openStore({ ...database.spec, migrateUntil: "0007_key_limits" });
  try {
    const applied = await older.db
      .selectFrom("llmgw_migrations" as never)
      .select("name" as never)
      .execute();
    assert.equal(applied.length, 7, "the store stopped at 0007");
    const old = (fields: {
      at: string;
      key_id: string | null;
      model: string;
      duration_ms: number;
      ttft_ms: number | null;
      stream: number;
      status: number;
    }) => ({
      replica_id: null,
      endpoint: "/v1/chat/completions",
      prompt_tokens: 10,
      completion_tokens: 5,
      ...fields,
    });
    const rows = [
      old({ at: "2026-11-30T10:00:01.000Z", key_id: "key-a", model: "tiny", duration_ms: 10, ttft_ms: 4, stream: 1, status: 200 }),
      old({ at: "2026-11-30T10:00:02.000Z", key_id: "key-a", model: "tiny", duration_ms: 20, ttft_ms: 20, stream: 0, status: 200 }),
      old({ at: "2026-11-30T10:00:03.000Z", key_id: "key-a", model: "tiny", duration_ms: 30, ttft_ms: 30, stream: 0, status: 499 }),
      old({ at: "2026-11-30T11:15:00.000Z", key_id: null, model: "other", duration_ms: 7, ttft_ms: null, stream: 0, status: 500 }),
    ];
    // 6000 more rows in 12:00-12:59, each minute's rows both sides of the backfill's 5000-row page.
    for (let i = 0; i < 6000; i += 1) {
      rows.push(
        old({
          at: `2026-11-30T12:${String(i % 60).padStart(2, "0")}:00.000Z`,
          key_id: "key-b",
          model: "tiny",
          duration_ms: (i % 100) + 1,
          ttft_ms: null,
          stream: 0,
          status: 200,
        }),
      );
    }
    for (let offset = 0; offset < rows.length; offset += 1000)
      await older.db
        .insertInto("usage")
        .values(rows.slice(offset, offset + 1000))
        .execute();
  } finally {
    await older.close();
  }

  const store = await database.open();
  try {
    const minutes = await store.db.selectFrom("usage_minutes").selectAll().where("key_id", "!=", "key-b").orderBy("minute").execute();
    assert.deepEqual(
      minutes.map((m) => [
        m.minute,
        m.key_id,
        m.model,
        Number(m.requests),
        Number(m.errors),
        Number(m.prompt_tokens),
        Number(m.completion_tokens),
        Number(m.cost_usd),
      ]),
      [
        ["2026-11-30T10:00:00.000Z", "key-a", "tiny", 3, 1, 30, 15, 0],
        ["2026-11-30T11:15:00.000Z", "", "other", 1, 1, 10, 5, 0],
      ],
    );
    assert.deepEqual(JSON.parse(minutes[0]!.ttft_hist), { [String(bucketOf(4))]: 1 }, "the ttft of the stream only");
    const split = await store.db.selectFrom("usage_minutes").select(["requests", "duration_hist"]).where("key_id", "=", "key-b").execute();
    assert.equal(split.length, 60);
    for (const minute of split) {
      assert.equal(Number(minute.requests), 100);
      const counted = Object.values(JSON.parse(minute.duration_hist) as Record<string, number>).reduce((sum, n) => sum + Number(n), 0);
      assert.equal(counted, 100, "a minute both pages added to has every latency in its histogram");
    }
    const hours = await store.db.selectFrom("usage_hours").select(["hour", "key_id", "requests"]).orderBy("hour").execute();
    assert.deepEqual(
      hours.map((h) => [h.hour, h.key_id, Number(h.requests)]),
      [
        ["2026-11-30T10:00:00.000Z", "key-a", 3],
        ["2026-11-30T11:00:00.000Z", "", 1],
        ["2026-11-30T12:00:00.000Z", "key-b", 6000],
      ],
    );
    // The report over the day reads the hourly rollups the backfill wrote: durations 1..100 ms, 60 times each.
    const report = await queryUsage(store, everything(["key"], { from: "2026-11-30T00:00:00Z" }), keyName);
    assert.deepEqual(
      report.rows.map((r) => [r.key, r.requests, r.errors]),
      [
        [null, 1, 1],
        ["alice", 3, 1],
        ["bob", 6000, 0],
      ],
    );
    withinBound(report.rows[2]!.p50_ms, 50, "p50 of the backfilled rows");
    withinBound(report.rows[2]!.p95_ms, 95, "p95 of the backfilled rows");
    assert.equal(report.rows[1]!.ttft_p50_ms, 4);
  } finally {
    await store.close();
  }
});
