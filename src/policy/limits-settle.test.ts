// Settlements of the limits service against both stores: a settlement the store refuses is
// not lost (it stays queued and is retried until the store takes it), and many settlements
// of one key add up exactly, written together.
import assert from "node:assert/strict";
import { Writable } from "node:stream";
import { sql } from "kysely";
import { createLogger } from "../core/log.ts";
import type { CatalogModel } from "../catalog/catalog.ts";
import type { Principal } from "../keys/key-service.ts";
import type { Store } from "../store/store.ts";
import { testBothStores } from "../../test/support/stores.ts";
import { eventually } from "../../test/support/eventually.ts";
import { costUsd } from "./cost.ts";
import { LimitsService, worstCaseUsage } from "./limits.ts";
import { LimitStore, budgetPeriodAt, usdToNano } from "./limit-store.ts";
import { tokenBound } from "./token-bound.ts";

const PRICES = { input_per_million: 1000, output_per_million: 2000 };
const MODEL = { id: "m1", name: "m", definition: { prices: PRICES } } as unknown as CatalogModel;
const BODY = { model: "m", messages: [{ role: "user", content: "hi" }], max_tokens: 10 };
const NOW = Date.parse("2027-03-10T10:00:30.000Z");

function principal(keyId: string): Principal {
  return {
    keyId,
    name: keyId,
    role: "client",
    limits: { rpm: null, tpm: null, budgetUsd: 100, budgetPeriod: "total", models: new Map() },
  } as unknown as Principal;
}

function warnings(): { logger: ReturnType<typeof createLogger>; lines: string[] } {
  const lines: string[] = [];
  const destination = new Writable({
    write(chunk, _encoding, done) {
      lines.push(String(chunk));
      done();
    },
  });
  return { logger: createLogger({ level: "warn", destination, format: "json" }), lines };
}

/** Makes every write of key_budgets fail (a store refusing the settlement), until undone. */
async function refuseBudgetUpdates(store: Store): Promise<() => Promise<void>> {
  if (store.dialect === "sqlite") {
    // SQLite writes a budget row behind, as an upsert: a row not yet stored is an INSERT.
    await sql`CREATE TRIGGER refuse_settle BEFORE UPDATE ON key_budgets BEGIN SELECT RAISE(ABORT, 'settlement refused by the test'); END`.execute(store.db);
    await sql`CREATE TRIGGER refuse_settle_insert BEFORE INSERT ON key_budgets BEGIN SELECT RAISE(ABORT, 'settlement refused by the test'); END`.execute(
      store.db,
    );
    return async () => {
      await sql`DROP TRIGGER refuse_settle`.execute(store.db);
      await sql`DROP TRIGGER refuse_settle_insert`.execute(store.db);
    };
  }
  await sql`CREATE FUNCTION refuse_settle() RETURNS trigger AS $$ BEGIN RAISE EXCEPTION 'settlement refused by the test'; END $$ LANGUAGE plpgsql`.execute(
    store.db,
  );
  await sql`CREATE TRIGGER refuse_settle BEFORE UPDATE ON key_budgets FOR EACH ROW EXECUTE FUNCTION refuse_settle()`.execute(store.db);
  return async () => {
    await sql`DROP TRIGGER refuse_settle ON key_budgets`.execute(store.db);
    await sql`DROP FUNCTION refuse_settle()`.execute(store.db);
  };
}

/** The spent amount the store itself holds (null: no row), bypassing SQLite's in-memory counters. */
async function storedSpent(store: Store, keyId: string, period: string): Promise<number | null> {
  const row = await store.db.selectFrom("key_budgets").select("spent_nano").where("key_id", "=", keyId).where("period", "=", period).executeTakeFirst();
  return row === undefined ? null : Number(row.spent_nano);
}

testBothStores("a settlement the store refuses is retried until it is written, so the reservation does not leak", async (store) => {
  const { logger, lines } = warnings();
  const limits = new LimitsService({ store, logger, clock: () => NOW });
  const readBack = new LimitStore(store);
  const period = budgetPeriodAt("total", NOW).id;
  const permit = await limits.admit({ principal: principal("k-retry"), model: MODEL, body: BODY, endpoint: "/v1/chat/completions" });
  const reservedNano = usdToNano(costUsd(PRICES, worstCaseUsage(tokenBound("/v1/chat/completions", BODY, MODEL), PRICES)));
  assert.deepEqual(await readBack.budgetUse("k-retry", period), { spentNano: 0, reservedNano });
  const allow = await refuseBudgetUpdates(store);
  const usage = { prompt_tokens: 7, completion_tokens: 5, total_tokens: 12 };
  permit.settle({ usage, answered: true });
  await eventually("a failed settlement to be logged", () => lines.some((line) => line.includes("settlements failed")));
  const spentNano = usdToNano(costUsd(PRICES, usage));
  if (store.dialect === "sqlite") {
    // SQLite: the counters in memory are the truth at once; the store has nothing of it yet.
    assert.deepEqual(await readBack.budgetUse("k-retry", period), { spentNano, reservedNano: 0 });
    assert.equal(await storedSpent(store, "k-retry", period), null, "the refused write changed nothing in the store");
  } else {
    assert.deepEqual(await readBack.budgetUse("k-retry", period), { spentNano: 0, reservedNano }, "the refused settlement changed nothing yet");
  }
  await allow();
  const settled = await eventually("the retry to write the settlement", async () => {
    const use = await readBack.budgetUse("k-retry", period);
    const stored = await storedSpent(store, "k-retry", period);
    return use.reservedNano === 0 && stored !== null ? { ...use, stored } : null;
  });
  assert.equal(settled.spentNano, spentNano, "spent is what the upstream reported, not less");
  assert.equal(settled.stored, spentNano, "the store has it");
  await limits.close();
});

testBothStores("many settlements of one key, written together, add up exactly", async (store) => {
  const { logger } = warnings();
  const limits = new LimitsService({ store, logger, clock: () => NOW });
  const permits = await Promise.all(
    Array.from({ length: 20 }, () => limits.admit({ principal: principal("k-many"), model: MODEL, body: BODY, endpoint: "/v1/chat/completions" })),
  );
  const usages = permits.map((_, index) => ({ prompt_tokens: 7, completion_tokens: index % 10, total_tokens: 7 + (index % 10) }));
  for (const [index, permit] of permits.entries()) permit.settle({ usage: usages[index]!, answered: true });
  await limits.close();
  const use = await new LimitStore(store).budgetUse("k-many", "total");
  assert.equal(use.reservedNano, 0);
  assert.equal(
    use.spentNano,
    usages.reduce((sum, usage) => sum + usdToNano(costUsd(PRICES, usage)), 0),
  );
});

testBothStores("admissions at once: a request refused by the budget leaves no count in its rate window", async (store) => {
  const { logger } = warnings();
  const limits = new LimitsService({ store, logger, clock: () => NOW });
  const cost = costUsd(PRICES, worstCaseUsage(tokenBound("/v1/chat/completions", BODY, MODEL), PRICES));
  const who = {
    ...principal("k-burst"),
    limits: { rpm: 100, tpm: null, budgetUsd: Number((cost * 10.5).toFixed(9)), budgetPeriod: "total", models: new Map() },
  } as unknown as Principal;
  // 30 admissions in one event-loop turn: on SQLite they share one transaction, each in its own savepoint.
  const outcomes = await Promise.allSettled(
    Array.from({ length: 30 }, () => limits.admit({ principal: who, model: MODEL, body: BODY, endpoint: "/v1/chat/completions" })),
  );
  const admitted = outcomes.filter((outcome) => outcome.status === "fulfilled");
  assert.equal(admitted.length, 10, "exactly the ten that fit the budget");
  for (const outcome of outcomes) if (outcome.status === "rejected") assert.equal((outcome.reason as { code?: string }).code, "insufficient_quota");
  const readBack = new LimitStore(store);
  const window = await readBack.windowUse({ keyId: "k-burst", model: "*", windowStart: new Date(Math.floor(NOW / 60_000) * 60_000).toISOString() });
  assert.equal(window.requests, 10, "the refused requests' window counts were rolled back");
  assert.equal((await readBack.budgetUse("k-burst", "total")).reservedNano, 10 * usdToNano(cost));
  await limits.close();
});
