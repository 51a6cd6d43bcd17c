// Benchmark of migration 0008's backfill (src/store/migrations/0008-usage-backfill.ts): a database at
// migration 0007 holding N raw usage rows (10 keys × 3 models, one row every 1.2 s), then
// the time the next open takes to migrate it, which is the time an upgrade delays a start.
//   npx tsx bench/usage/backfill.ts [--rows 500000] [--postgres]   (--postgres: LLMGW_TEST_POSTGRES, a new schema)
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { flagReader } from "../flags.ts";
import { openStore } from "../../src/store/store.ts";
import { dropSchema, TEST_POSTGRES_URL } from "../../test/support/stores.ts";

const argv = process.argv.slice(2);
const flag = flagReader(argv);
const rows = Number(flag("rows", "BENCH_ROWS") ?? 500_000);
const postgres = argv.includes("--postgres");
const dir = mkdtempSync(path.join(tmpdir(), "llmgw-backfill-bench-"));
const spec: { database: string; schema?: string } = postgres
  ? { database: TEST_POSTGRES_URL, schema: `llmgw_bench_${Date.now()}` }
  : { database: path.join(dir, "llmgw.db") };

try {
  const older = await openStore({ ...spec, migrateUntil: "0007_key_limits" });
  const start = Date.parse("2026-11-01T00:00:00Z");
  for (let offset = 0; offset < rows; offset += 1000) {
    const page = Array.from({ length: Math.min(1000, rows - offset) }, (_, j) => {
      const i = offset + j;
      return {
        at: new Date(start + i * 1200).toISOString(),
        key_id: `key-${i % 10}`,
        model: `model-${i % 3}`,
        replica_id: null,
        endpoint: "/v1/chat/completions",
        prompt_tokens: 10,
        completion_tokens: 5,
        ttft_ms: 50 + (i % 300),
        duration_ms: 200 + (i % 3000),
        status: 200,
        stream: i % 2,
      };
    });
    await older.db.insertInto("usage").values(page).execute();
  }
  await older.close();
  const began = performance.now();
  const store = await openStore(spec);
  const took = (performance.now() - began) / 1000;
  const minutes = await store.db
    .selectFrom("usage_minutes")
    .select((eb) => eb.fn.countAll<number>().as("n"))
    .executeTakeFirstOrThrow();
  console.log(`${postgres ? "PostgreSQL" : "SQLite"}: migration 0008 added up ${rows} raw rows into ${Number(minutes.n)} minute rows in ${took.toFixed(1)} s`);
  await store.close();
} finally {
  if (spec.schema !== undefined) await dropSchema(spec.schema);
  rmSync(dir, { recursive: true, force: true });
}
