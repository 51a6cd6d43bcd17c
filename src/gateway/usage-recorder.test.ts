// The usage recorder when the store refuses writes: requests go on, rows wait in the
// spool (memory, then files in the data dir) and reach the store when it takes them
// again; only rows past the spool's bounds are dropped, counted, and logged once a minute.
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { pino } from "pino";
import { UsageRecorder, type UsageRow } from "./usage-recorder.ts";
import { openSqliteTestStore } from "../../test/support/stores.ts";
import { postgresViaProxy } from "../../test/support/postgres-via-proxy.ts";
import { eventually } from "../../test/support/eventually.ts";
import type { Store } from "../store/store.ts";

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

function collectingLogger(): { logger: pino.Logger; lines: Array<Record<string, unknown>> } {
  const lines: Array<Record<string, unknown>> = [];
  const logger = pino({ level: "info" }, { write: (line: string) => void lines.push(JSON.parse(line) as Record<string, unknown>) });
  return { logger, lines };
}

async function storedModels(store: Store): Promise<string[]> {
  const rows = await store.db.selectFrom("usage").select("model").orderBy("model").execute();
  return rows.map((r) => r.model);
}

function spoolFiles(dataDir: string): string[] {
  const dir = path.join(dataDir, "usage-spool");
  return existsSync(dir) ? readdirSync(dir) : [];
}

test("rows a read-only store refuses are spooled in memory and written once it takes them; past the bound they are dropped, counted and logged once a minute", async () => {
  const { store, cleanup } = await openSqliteTestStore();
  try {
    const { logger, lines } = collectingLogger();
    let now = Date.parse("2026-11-30T10:00:00Z");
    const usage = new UsageRecorder({ store, logger, clock: () => now, spoolMemoryRows: 4 });

    // query_only: every write fails with SQLITE_READONLY, as on a read-only data dir.
    store.sqlite!.pragma("query_only = 1");
    for (let i = 0; i < 3; i += 1) usage.record(row("a"));
    await usage.flush();
    assert.equal(usage.spooledRows(), 3);
    assert.equal(usage.droppedRows(), 0, "refused rows are kept, not dropped");
    assert.equal(store.health.fault()?.code, "SQLITE_READONLY", "the fault is noted for /readyz");
    for (let i = 0; i < 2; i += 1) usage.record(row("b"));
    await usage.flush();
    assert.equal(usage.spooledRows(), 4, "the memory bound");
    assert.equal(usage.droppedRows(), 1, "the row past the bound (no data dir: no files)");
    const drops = lines.filter((line) => /^dropped/.test(String(line.msg)));
    assert.equal(drops.length, 1);
    assert.match(String(drops[0]!.msg), /^dropped 1 usage row the store refused \(1 since start\)/);
    assert.match(String(drops[0]!.err), /storage unavailable.*read-only.*SQLITE_READONLY/i);

    usage.record(row("c"));
    await usage.flush();
    assert.equal(lines.filter((line) => /^dropped/.test(String(line.msg))).length, 1, "one line a minute, however many drops");
    now += 61_000;
    usage.record(row("c"));
    await usage.flush();
    const later = lines.filter((line) => /^dropped/.test(String(line.msg)));
    assert.equal(later.length, 2, "a minute later, the next line");
    assert.equal(later[1]!.rows, 2, "it counts the rows dropped since the last line");
    assert.equal(later[1]!.total, 3);

    store.sqlite!.pragma("query_only = 0");
    await eventually("the spooled rows to be written", () => usage.spooledRows() === 0);
    usage.record(row("d"));
    await usage.close();
    assert.deepEqual(await storedModels(store), ["a", "a", "a", "b", "d"]);
    assert.equal(usage.droppedRows(), 3);
  } finally {
    await cleanup();
  }
});

test("while PostgreSQL is cut, usage rows wait in memory and then in files, and all reach the store when it returns", async (t) => {
  const pg = await postgresViaProxy(t);
  if (pg === null) return;
  const dataDir = mkdtempSync(path.join(tmpdir(), "llmgw-spool-"));
  try {
    const { logger, lines } = collectingLogger();
    const usage = new UsageRecorder({ store: pg.store, logger, dataDir, spoolMemoryRows: 5 });
    usage.record(row("before"));
    await usage.flush();
    await pg.cut();
    for (let batch = 0; batch < 3; batch += 1) {
      for (let i = 0; i < 4; i += 1) usage.record(row(`during-${batch}`));
      await usage.flush();
    }
    assert.equal(usage.spooledRows(), 12);
    assert.equal(usage.droppedRows(), 0);
    assert.equal(spoolFiles(dataDir).length, 1, "the rows past the memory bound are in a spool file");
    assert.ok(lines.some((line) => /the store refuses usage rows: keeping them \(up to 5 in memory, then in .*usage-spool/.test(String(line.msg))));

    await pg.proxy.set("forward");
    // A written file leaves the spool's count before it is removed from the disk.
    await eventually("the spool to empty, its file removed", () => usage.spooledRows() === 0 && spoolFiles(dataDir).length === 0);
    assert.equal((await storedModels(pg.store)).length, 13, "every spooled row is in the store");
    const aggregated = await pg.store.db
      .selectFrom("usage_minutes")
      .select((eb) => eb.fn.sum<number>("requests").as("requests"))
      .executeTakeFirstOrThrow();
    assert.equal(Number(aggregated.requests), 13, "the aggregates count the spooled rows too");
    await usage.close();
    assert.equal(usage.droppedRows(), 0);
  } finally {
    rmSync(dataDir, { recursive: true, force: true });
    await pg.cleanup();
  }
});

test("rows past the spool files' bound are dropped and counted; what a stop leaves in the spool is written by the next start", async (t) => {
  const pg = await postgresViaProxy(t);
  if (pg === null) return;
  const dataDir = mkdtempSync(path.join(tmpdir(), "llmgw-spool-"));
  try {
    const lineBytes = Buffer.byteLength(`${JSON.stringify(row("x-0"))}\n`);
    const first = new UsageRecorder({ store: pg.store, dataDir, spoolMemoryRows: 2, spoolFileBytes: lineBytes * 3 });
    await pg.cut();
    for (let i = 0; i < 8; i += 1) first.record(row(`x-${i}`));
    await first.flush();
    assert.equal(first.spooledRows(), 5, "2 in memory, 3 in the file");
    assert.equal(first.droppedRows(), 3, "the rest is past both bounds");
    // A stop while the database is still cut: the rows in memory go to a file too (past its bound: dropped).
    await first.close();
    assert.equal(first.droppedRows(), 5);
    assert.ok(spoolFiles(dataDir).length > 0);

    await pg.proxy.set("forward");
    const second = new UsageRecorder({ store: pg.store, dataDir });
    assert.equal(second.spooledRows(), 3, "the next start finds the spooled rows");
    await eventually("the leftover rows in the store, the file removed", () => second.spooledRows() === 0 && spoolFiles(dataDir).length === 0);
    await second.close();
    assert.deepEqual(await storedModels(pg.store), ["x-2", "x-3", "x-4"], "written once each");
  } finally {
    rmSync(dataDir, { recursive: true, force: true });
    await pg.cleanup();
  }
});

test("a spool file whose rows are written but that cannot be removed is not written again", async () => {
  const { store, cleanup } = await openSqliteTestStore();
  const dataDir = mkdtempSync(path.join(tmpdir(), "llmgw-spool-"));
  try {
    const { logger, lines } = collectingLogger();
    // As on a data dir turned read-only after the spool file was written.
    const removeSpoolFile = async () => {
      throw Object.assign(new Error("EROFS: read-only file system, unlink"), { code: "EROFS" });
    };
    const usage = new UsageRecorder({ store, logger, dataDir, spoolMemoryRows: 1, removeSpoolFile });
    store.sqlite!.pragma("query_only = 1");
    for (let i = 0; i < 3; i += 1) usage.record(row(`spooled-${i}`));
    await usage.flush();
    assert.equal(usage.spooledRows(), 3, "1 in memory, 2 in a file");
    assert.equal(spoolFiles(dataDir).length, 1);

    store.sqlite!.pragma("query_only = 0");
    await eventually("the spool to empty although its file stays", () => usage.spooledRows() === 0);
    assert.equal(spoolFiles(dataDir).length, 1, "the file could not be removed");
    const notRemoved = lines.filter((line) => /cannot be removed/.test(String(line.msg)));
    assert.equal(notRemoved.length, 1, "said once");
    assert.match(String(notRemoved[0]!.msg), /remove it by hand before the next start/);

    // Another refusal and drain: the file written before is not written again.
    store.sqlite!.pragma("query_only = 1");
    usage.record(row("later"));
    await usage.flush();
    store.sqlite!.pragma("query_only = 0");
    await eventually("the later row to be written", () => usage.spooledRows() === 0);
    await usage.close();
    assert.deepEqual(await storedModels(store), ["later", "spooled-0", "spooled-1", "spooled-2"], "each row written once");
    assert.equal(lines.filter((line) => /cannot be removed/.test(String(line.msg))).length, 1);
  } finally {
    rmSync(dataDir, { recursive: true, force: true });
    await cleanup();
  }
});
