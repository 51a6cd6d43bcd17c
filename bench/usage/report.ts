// Benchmark of a long usage report (review item 2 of issue 9): fills a SQLite store with
// 30 days × 10 keys × 3 models of per-minute aggregates (1.3 M rows, each with a few
// requests and sparse histograms like a busy minute's), then times GET /api/v1/usage's
// query for the whole month (ungrouped, per day and key, per hour and model) and the
// longest stretch the event loop was blocked while it ran. SQLite only: better-sqlite3 is
// synchronous, so that is where a report blocks the event loop; PostgreSQL answers on the
// pool without blocking.
// The query reads whole hours from usage_hours, so the range is cut 30 min into the first
// and last hours to make it read minute rows too.
//   npx tsx bench/usage/report.ts [--days 30] [--keys 10] [--models 3] [--database FILE]
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { monitorEventLoopDelay } from "node:perf_hooks";
import { flagReader } from "../flags.ts";
import { openStore } from "../../src/store/store.ts";
import { observe, type Histogram } from "../../src/usage/latency-histogram.ts";
import { queryUsage, type UsageGroup } from "../../src/usage/usage-query.ts";

const flag = flagReader(process.argv.slice(2));
const days = Number(flag("days", "BENCH_DAYS") ?? 30);
const keys = Number(flag("keys", "BENCH_KEYS") ?? 10);
const models = Number(flag("models", "BENCH_MODELS") ?? 3);
const dir = mkdtempSync(path.join(tmpdir(), "llmgw-usage-bench-"));
const store = await openStore({ database: flag("database", "BENCH_DATABASE") ?? path.join(dir, "llmgw.db") });
const end = Date.parse("2026-12-01T00:00:00Z");
const start = end - days * 86_400_000;

try {
  const sqlite = store.sqlite!;
  const insert = sqlite.prepare(
    "INSERT INTO usage_minutes (minute, key_id, model, requests, errors, prompt_tokens, completion_tokens, cost_usd, duration_hist, ttft_hist) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
  );
  let seed = 1;
  const random = () => {
    seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31;
    return seed / 2 ** 31;
  };
  // The hourly rollups hold what the recorder would have added up from the same minutes.
  const insertHour = sqlite.prepare(
    "INSERT INTO usage_hours (hour, key_id, model, requests, errors, prompt_tokens, completion_tokens, cost_usd, duration_hist, ttft_hist) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
  );
  const fill = sqlite.transaction((from: number, to: number) => {
    for (let hour = from; hour < to; hour += 3_600_000) {
      const hours = new Map<string, { requests: number; errors: number; duration: Histogram; ttft: Histogram }>();
      for (let minute = hour; minute < hour + 3_600_000; minute += 60_000) {
        const at = new Date(minute).toISOString();
        for (let k = 0; k < keys; k += 1) {
          for (let m = 0; m < models; m += 1) {
            const requests = 1 + Math.floor(random() * 8);
            const errors = random() < 0.05 ? 1 : 0;
            const duration: Histogram = {};
            const ttft: Histogram = {};
            const sums = hours.get(`${k} ${m}`) ?? { requests: 0, errors: 0, duration: {}, ttft: {} };
            hours.set(`${k} ${m}`, sums);
            for (let r = 0; r < requests; r += 1) {
              const ms = 200 + random() * 3000;
              const first = 20 + random() * 300;
              observe(duration, ms);
              observe(ttft, first);
              observe(sums.duration, ms);
              observe(sums.ttft, first);
            }
            sums.requests += requests;
            sums.errors += errors;
            insert.run(
              at,
              `key-${k}`,
              `model-${m}`,
              requests,
              errors,
              requests * 300,
              requests * 120,
              requests * 0.0004,
              JSON.stringify(duration),
              JSON.stringify(ttft),
            );
          }
        }
      }
      for (const [id, sums] of hours) {
        const [k, m] = id.split(" ");
        insertHour.run(
          new Date(hour).toISOString(),
          `key-${k}`,
          `model-${m}`,
          sums.requests,
          sums.errors,
          sums.requests * 300,
          sums.requests * 120,
          sums.requests * 0.0004,
          JSON.stringify(sums.duration),
          JSON.stringify(sums.ttft),
        );
      }
    }
  });
  const filling = Date.now();
  for (let day = start; day < end; day += 86_400_000) fill(day, day + 86_400_000);
  const count = sqlite.prepare("SELECT count(*) AS n FROM usage_minutes").get() as { n: number };
  console.log(`filled ${count.n} minute rows (${days} days × ${keys} keys × ${models} models) in ${((Date.now() - filling) / 1000).toFixed(1)} s`);

  const names = (id: string) => id.replace("key-", "name-");
  for (const groupBy of [[], ["day", "key"], ["hour", "model"]] as UsageGroup[][]) {
    const delay = monitorEventLoopDelay({ resolution: 5 });
    delay.enable();
    // A timer that should fire every 10 ms: the longest gap between its runs is the longest block.
    let last = performance.now();
    let longest = 0;
    const ticker = setInterval(() => {
      const now = performance.now();
      longest = Math.max(longest, now - last);
      last = now;
    }, 10);
    const began = performance.now();
    const report = await queryUsage(
      store,
      { from: new Date(start + 1_800_000).toISOString(), to: new Date(end - 1_800_000).toISOString(), keyIds: null, model: null, groupBy },
      names,
    );
    const took = performance.now() - began;
    longest = Math.max(longest, performance.now() - last);
    clearInterval(ticker);
    delay.disable();
    console.log(
      `group_by=${groupBy.join(",") || "(none)"}: ${report.rows.length} rows (total ${report.total.requests} requests) in ${took.toFixed(0)} ms; event loop blocked at most ${longest.toFixed(0)} ms`,
    );
  }
} finally {
  await store.close();
  rmSync(dir, { recursive: true, force: true });
}
