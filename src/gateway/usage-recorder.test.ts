// The usage recorder when the store refuses writes: requests go on, rows are counted as
// dropped, and the log gets one line a minute, not one per request.
import { test } from "node:test";
import assert from "node:assert/strict";
import { pino } from "pino";
import { UsageRecorder, type UsageRow } from "./usage-recorder.ts";
import { openSqliteTestStore } from "../../test/support/stores.ts";

const row = (model: string): UsageRow => ({
  at: new Date().toISOString(),
  key_id: null,
  model,
  replica_id: null,
  endpoint: "/v1/chat/completions",
  prompt_tokens: 1,
  completion_tokens: 1,
  ttft_ms: null,
  duration_ms: 5,
  status: 200,
  stream: 0,
  cost_usd: null,
  guard_ms: null,
});

test("rows the store refuses are counted as dropped and logged once a minute", async () => {
  const { store, cleanup } = await openSqliteTestStore();
  try {
    const lines: Array<Record<string, unknown>> = [];
    const logger = pino({ level: "info" }, { write: (line: string) => void lines.push(JSON.parse(line) as Record<string, unknown>) });
    let now = Date.parse("2026-11-30T10:00:00Z");
    const usage = new UsageRecorder({ store, logger, clock: () => now });

    // query_only: every write fails with SQLITE_READONLY, as on a read-only data dir.
    store.sqlite!.pragma("query_only = 1");
    for (let i = 0; i < 3; i += 1) usage.record(row("a"));
    await usage.flush();
    for (let i = 0; i < 2; i += 1) usage.record(row("b"));
    await usage.flush();
    assert.equal(usage.droppedRows(), 5);
    assert.equal(lines.length, 1, "one line for two failed batches within a minute");
    assert.equal(lines[0]!.rows, 3);
    assert.match(String(lines[0]!.msg), /^dropped 3 usage rows the store refused \(3 since start\)/);
    assert.match(String(lines[0]!.err), /storage unavailable.*read-only.*SQLITE_READONLY/i);
    assert.equal(store.health.fault()?.code, "SQLITE_READONLY", "the fault is noted for /readyz");

    now += 61_000;
    usage.record(row("c"));
    await usage.flush();
    assert.equal(lines.length, 2, "a minute later, the next line");
    assert.equal(lines[1]!.rows, 3, "it counts the rows dropped since the last line");
    assert.equal(lines[1]!.total, 6);

    store.sqlite!.pragma("query_only = 0");
    usage.record(row("d"));
    await usage.close();
    assert.equal(usage.droppedRows(), 6, "a row the store takes is not dropped");
    const stored = await store.db.selectFrom("usage").select("model").execute();
    assert.deepEqual(stored, [{ model: "d" }]);
  } finally {
    await cleanup();
  }
});
