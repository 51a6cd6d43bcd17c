// The atomic statements of budgets and rate windows on both databases, and the periods
// and windows they count in, with an injected clock.
import { test } from "node:test";
import assert from "node:assert/strict";
import { testBothStores } from "../../test/support/stores.ts";
import { budgetPeriodAt, LimitStore, usdToNano, WHOLE_KEY, windowAt } from "./limit-store.ts";

const DAY_MS = 86_400_000;

test("budget periods are UTC days and months, and total never resets", () => {
  const lastSecondOfJanuary = Date.parse("2027-01-31T23:59:59.500Z");
  assert.deepEqual(budgetPeriodAt("day", lastSecondOfJanuary), {
    id: "2027-01-31",
    startsAt: Date.parse("2027-01-31T00:00:00Z"),
    resetsAt: Date.parse("2027-02-01T00:00:00Z"),
  });
  assert.deepEqual(budgetPeriodAt("month", lastSecondOfJanuary), {
    id: "2027-01",
    startsAt: Date.parse("2027-01-01T00:00:00Z"),
    resetsAt: Date.parse("2027-02-01T00:00:00Z"),
  });
  assert.equal(budgetPeriodAt("day", lastSecondOfJanuary + 1000).id, "2027-02-01");
  assert.equal(budgetPeriodAt("month", lastSecondOfJanuary + 1000).id, "2027-02");
  assert.equal(budgetPeriodAt("month", Date.parse("2026-12-15T12:00:00Z")).resetsAt, Date.parse("2027-01-01T00:00:00Z"), "December rolls into the next year");
  assert.deepEqual(budgetPeriodAt("total", lastSecondOfJanuary), { id: "total", startsAt: null, resetsAt: null });
  assert.deepEqual(windowAt(Date.parse("2027-01-31T23:59:59.500Z")), { start: "2027-01-31T23:59:00.000Z", endsAt: Date.parse("2027-02-01T00:00:00Z") });
  assert.equal(usdToNano(0.1 + 0.2), 300_000_000, "float noise does not add a nano-USD");
});

testBothStores("a budget reservation is refused once spent + reserved + amount would pass the limit", async (store) => {
  const limits = new LimitStore(store);
  const now = Date.parse("2027-01-31T10:00:00Z");
  const period = budgetPeriodAt("day", now).id;
  const reserve = (amountNano: number) => limits.reserveBudget({ keyId: "k1", period, amountNano, limitNano: 1000, now });
  assert.deepEqual(await reserve(400), { spentNano: 0, reservedNano: 400 });
  assert.deepEqual(await reserve(400), { spentNano: 0, reservedNano: 800 });
  assert.equal(await reserve(201), null, "800 + 201 > 1000");
  assert.deepEqual(await limits.budgetUse("k1", period), { spentNano: 0, reservedNano: 800 }, "a refusal changes nothing");
  // The first request cost 150 of its 400: 250 comes free again.
  await limits.settleBudget({ keyId: "k1", period, reservedNano: 400, chargedNano: 150, now });
  assert.deepEqual(await limits.budgetUse("k1", period), { spentNano: 150, reservedNano: 400 });
  assert.deepEqual(await reserve(450), { spentNano: 150, reservedNano: 850 }, "150 + 400 + 450 = 1000 fits exactly");
  assert.equal(await reserve(1), null);
  // Another key counts apart; the next UTC day is a new period.
  assert.deepEqual(await limits.reserveBudget({ keyId: "k2", period, amountNano: 1000, limitNano: 1000, now }), { spentNano: 0, reservedNano: 1000 });
  const tomorrow = budgetPeriodAt("day", now + DAY_MS).id;
  assert.deepEqual(await limits.reserveBudget({ keyId: "k1", period: tomorrow, amountNano: 1000, limitNano: 1000, now: now + DAY_MS }), {
    spentNano: 0,
    reservedNano: 1000,
  });
  // A month rolls over the same way.
  const january = budgetPeriodAt("month", now).id;
  const february = budgetPeriodAt("month", Date.parse("2027-02-01T00:00:00Z")).id;
  assert.deepEqual(await limits.reserveBudget({ keyId: "k3", period: january, amountNano: 1000, limitNano: 1000, now }), { spentNano: 0, reservedNano: 1000 });
  assert.equal(await limits.reserveBudget({ keyId: "k3", period: january, amountNano: 1, limitNano: 1000, now }), null);
  assert.deepEqual(await limits.reserveBudget({ keyId: "k3", period: february, amountNano: 1, limitNano: 1000, now }), { spentNano: 0, reservedNano: 1 });
});

testBothStores("many reservations at once never add up past the budget", async (store) => {
  const limits = new LimitStore(store);
  const now = Date.parse("2027-01-31T10:00:00Z");
  const results = await Promise.all(
    Array.from({ length: 60 }, () => limits.reserveBudget({ keyId: "k", period: "total", amountNano: 7, limitNano: 100, now })),
  );
  assert.equal(results.filter((r) => r !== null).length, 14, "exactly floor(100 / 7) fit");
  assert.deepEqual(await limits.budgetUse("k", "total"), { spentNano: 0, reservedNano: 98 });
});

testBothStores("a rate window counts requests and tokens, refuses past either limit, and a new minute starts afresh", async (store) => {
  const limits = new LimitStore(store);
  const now = Date.parse("2027-01-31T10:00:30Z");
  const window = windowAt(now);
  const ref = { keyId: "k", model: WHOLE_KEY, windowStart: window.start };
  const reserve = (tokens: number, windowStart = window.start) => limits.reserveWindow({ ...ref, windowStart, tokens, rpm: 3, tpm: 100 });
  assert.deepEqual(await reserve(40), { requests: 1, tokens: 40 });
  assert.deepEqual(await reserve(40), { requests: 2, tokens: 80 });
  assert.equal(await reserve(21), null, "80 + 21 tokens > 100");
  // The first request used 10 of its 40 tokens.
  await limits.adjustWindow({ ...ref, requests: 0, tokens: -30 });
  assert.deepEqual(await reserve(21), { requests: 3, tokens: 71 });
  assert.equal(await reserve(1), null, "a fourth request > 3 per minute");
  assert.deepEqual(await limits.windowUse(ref), { requests: 3, tokens: 71 });
  // The next minute is a new window; a model's window counts apart from the key's.
  const next = windowAt(window.endsAt);
  assert.deepEqual(await reserve(100, next.start), { requests: 1, tokens: 100 });
  assert.deepEqual(await limits.reserveWindow({ ...ref, model: "m", tokens: 5, rpm: 1, tpm: null }), { requests: 1, tokens: 5 });
  assert.equal(await limits.reserveWindow({ ...ref, model: "m", tokens: 5, rpm: 1, tpm: null }), null);
  // Without limits the window only counts.
  for (let i = 0; i < 5; i += 1) assert.notEqual(await limits.reserveWindow({ ...ref, model: "free", tokens: 1000, rpm: null, tpm: null }), null);
});

testBothStores("many window reservations at once stop exactly at the rpm", async (store) => {
  const limits = new LimitStore(store);
  const windowStart = windowAt(Date.parse("2027-01-31T10:00:30Z")).start;
  const results = await Promise.all(
    Array.from({ length: 40 }, () => limits.reserveWindow({ keyId: "k", model: WHOLE_KEY, windowStart, tokens: 1, rpm: 9, tpm: null })),
  );
  assert.equal(results.filter((r) => r !== null).length, 9);
});
