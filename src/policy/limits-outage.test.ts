// Budgets and rate limits while PostgreSQL cannot be reached: admission goes on from the
// server's own counts (what the database last said plus what it admitted since), refuses
// what would not fit, and writes what those requests used once the database is back.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Writable } from "node:stream";
import { createLogger } from "../core/log.ts";
import type { CatalogModel } from "../catalog/catalog.ts";
import type { Principal } from "../keys/key-service.ts";
import { postgresViaProxy } from "../../test/support/postgres-via-proxy.ts";
import { eventually } from "../../test/support/eventually.ts";
import { costUsd } from "./cost.ts";
import { StorageUnavailableError } from "../store/storage-fault.ts";
import { LimitsService, worstCaseUsage } from "./limits.ts";
import { LimitStore, usdToNano } from "./limit-store.ts";
import { tokenBound } from "./token-bound.ts";

const PRICES = { input_per_million: 1000, output_per_million: 2000 };
const MODEL = { id: "m1", name: "m", definition: { prices: PRICES } } as unknown as CatalogModel;
const BODY = { model: "m", messages: [{ role: "user", content: "hi" }], max_tokens: 10 };
const NOW = Date.parse("2027-03-10T10:00:30.000Z");
const WINDOW = { model: "*", windowStart: "2027-03-10T10:00:00.000Z" };
const USAGE = { prompt_tokens: 7, completion_tokens: 5, total_tokens: 12 };
const RESERVED = usdToNano(costUsd(PRICES, worstCaseUsage(tokenBound("/v1/chat/completions", BODY, MODEL), PRICES)));

function keyWith(keyId: string, limits: { rpm: number | null; budgetUsd: number | null }): Principal {
  return { keyId, name: keyId, role: "client", limits: { tpm: null, budgetPeriod: "total", models: new Map(), ...limits } } as unknown as Principal;
}

function logLines(): { logger: ReturnType<typeof createLogger>; lines: string[] } {
  const lines: string[] = [];
  const destination = new Writable({
    write(chunk, _encoding, done) {
      lines.push(String(chunk));
      done();
    },
  });
  return { logger: createLogger({ level: "info", destination, format: "json" }), lines };
}

test("while PostgreSQL is cut, limits admit from this server's counts, refuse past them, and settle once it returns", async (t) => {
  const pg = await postgresViaProxy(t);
  if (pg === null) return;
  const { logger, lines } = logLines();
  const limits = new LimitsService({ store: pg.store, logger, clock: () => NOW });
  try {
    const rated = keyWith("k-rpm", { rpm: 3, budgetUsd: null });
    // Room for three reservations, not four: one before the outage, two during it.
    const budgeted = keyWith("k-budget", { rpm: null, budgetUsd: (RESERVED * 3.5) / 1e9 });
    // A budget this server has not reserved in since it started: what it spent is not known here.
    const unseen = keyWith("k-unseen", { rpm: null, budgetUsd: (RESERVED * 100) / 1e9 });
    const ask = (principal: Principal) => limits.admit({ principal, model: MODEL, body: BODY, endpoint: "/v1/chat/completions" });

    (await ask(rated)).settle({ usage: USAGE, answered: true });
    (await ask(budgeted)).settle({ usage: USAGE, answered: true });
    await limits.flushSettlements();

    await pg.cut();
    const fromMemory = [await ask(rated), await ask(rated)];
    await assert.rejects(
      Promise.resolve(ask(rated)),
      (e: unknown) => (e as { code?: string }).code === "rate_limit_exceeded",
      "the fourth request of the minute",
    );
    assert.ok(
      lines.some((line) => line.includes("admits limited keys from its own counts")),
      "the outage is logged",
    );
    fromMemory.push(await ask(budgeted), await ask(budgeted));
    await assert.rejects(
      Promise.resolve(ask(budgeted)),
      (e: unknown) => (e as { code?: string }).code === "insufficient_quota",
      "a fourth reservation does not fit the budget (the first still counts whole in memory)",
    );
    await assert.rejects(
      Promise.resolve(ask(unseen)),
      (e: unknown) => e instanceof StorageUnavailableError && e.status === 503,
      "a budget not known here is not counted from 0",
    );
    for (const permit of fromMemory) permit.settle({ usage: USAGE, answered: true });
    await limits.flushSettlements();

    await pg.proxy.set("forward");
    const readBack = new LimitStore(pg.store);
    const spent = usdToNano(costUsd(PRICES, USAGE));
    await eventually("what the requests of the outage used to be in the database", async () => {
      const window = await readBack.windowUse({ keyId: "k-rpm", ...WINDOW });
      const budget = await readBack.budgetUse("k-budget", "total");
      return window.requests === 3 && window.tokens === 3 * 12 && budget.spentNano === 3 * spent && budget.reservedNano === 0;
    });
    // Back on the database: it holds the three requests of this minute, so a fourth is refused there too.
    await eventually("admission through the database again", () => lines.some((line) => line.includes("reserved in the database again")));
    await assert.rejects(Promise.resolve(ask(rated)), (e: unknown) => (e as { code?: string }).code === "rate_limit_exceeded");
    const next = await ask(budgeted);
    const budget = await readBack.budgetUse("k-budget", "total");
    next.settle({ usage: null, answered: false });
    assert.deepEqual(budget, { spentNano: 3 * spent, reservedNano: RESERVED }, "the next reservation is made in the database, over what the outage spent");
    (await ask(unseen)).settle({ usage: null, answered: false });
  } finally {
    await limits.close();
    await pg.cleanup();
  }
});
