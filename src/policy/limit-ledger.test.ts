// SQLite's in-memory budget and rate counters across a restart: what was spent and counted
// survives closing and reopening the store, and no reservation of the old process is left;
// and no second server can open the same SQLite file.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { createLogger } from "../core/log.ts";
import type { CatalogModel } from "../catalog/catalog.ts";
import type { Principal } from "../keys/key-service.ts";
import { acquireServerLocks } from "../server/data-dir-lock.ts";
import { openStore } from "../store/store.ts";
import { costUsd } from "./cost.ts";
import { LimitsService } from "./limits.ts";
import { LimitStore, usdToNano, WHOLE_KEY, windowAt } from "./limit-store.ts";

const PRICES = { input_per_million: 1000, output_per_million: 2000 };
const MODEL = { id: "m1", name: "m", definition: { prices: PRICES } } as unknown as CatalogModel;
const BODY = { model: "m", messages: [{ role: "user", content: "hi" }], max_tokens: 10 };
const NOW = Date.parse("2027-03-10T10:00:30.000Z");
const WHO = {
  keyId: "k-restart",
  name: "k-restart",
  role: "client",
  limits: { rpm: 4, tpm: null, budgetUsd: 100, budgetPeriod: "total", models: new Map() },
} as unknown as Principal;

test("SQLite: a restart keeps spent and window counts, and leaves no reservation", async () => {
  const dir = mkdtempSync(path.join(tmpdir(), "llmgw-ledger-"));
  const database = path.join(dir, "llmgw.db");
  const logger = createLogger({ level: "error" });
  const admit = (limits: LimitsService) => limits.admit({ principal: WHO, model: MODEL, body: BODY, endpoint: "/v1/chat/completions" });
  const windowRef = { keyId: WHO.keyId, model: WHOLE_KEY, windowStart: windowAt(NOW).start };
  try {
    let store = await openStore({ database });
    let limits = new LimitsService({ store, logger, clock: () => NOW });
    const permits = [await admit(limits), await admit(limits), await admit(limits)];
    const usage = { prompt_tokens: 7, completion_tokens: 5, total_tokens: 12 };
    permits[0]!.settle({ usage, answered: true });
    permits[1]!.settle({ usage, answered: true });
    // The third is still in flight when the server stops.
    const before = await new LimitStore(store).budgetUse(WHO.keyId, "total");
    assert.equal(before.spentNano, 2 * usdToNano(costUsd(PRICES, usage)));
    assert.ok(before.reservedNano > 0, "the request in flight holds a reservation");
    await limits.close();
    await store.close();

    store = await openStore({ database });
    limits = new LimitsService({ store, logger, clock: () => NOW });
    const after = await new LimitStore(store).budgetUse(WHO.keyId, "total");
    assert.deepEqual(after, { spentNano: before.spentNano, reservedNano: 0 }, "spent survives, the old process's reservation does not");
    assert.equal((await new LimitStore(store).windowUse(windowRef)).requests, 3, "the minute's requests survive");
    const stored = await store.db.selectFrom("key_budgets").select(["spent_nano", "reserved_nano"]).where("key_id", "=", WHO.keyId).executeTakeFirstOrThrow();
    assert.deepEqual({ spent: Number(stored.spent_nano), reserved: Number(stored.reserved_nano) }, { spent: before.spentNano, reserved: 0 });
    // rpm 4: one more fits this minute, and on SQLite it is admitted without a promise (no
    // await on the gateway's path); the fifth is refused, as a rejected promise, never a throw.
    const fourth = admit(limits);
    assert.ok(!(fourth instanceof Promise), "a request that fits is admitted synchronously on SQLite");
    const fifth = admit(limits);
    assert.ok(fifth instanceof Promise, "a refusal comes back as a promise");
    await assert.rejects(fifth, (error: { code?: string }) => error.code === "rate_limit_exceeded");
    await limits.close();
    await store.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("two servers with their own data dirs cannot share one SQLite file (its counters live in one server's memory)", () => {
  const root = mkdtempSync(path.join(tmpdir(), "llmgw-ledger-lock-"));
  try {
    const database = path.join(root, "shared", "llmgw.db");
    mkdirSync(path.dirname(database));
    for (const dir of ["a", "b"]) mkdirSync(path.join(root, dir));
    const first = acquireServerLocks({ dataDir: path.join(root, "a"), address: "127.0.0.1:0", database });
    assert.throws(
      () => acquireServerLocks({ dataDir: path.join(root, "b"), address: "127.0.0.1:0", database }),
      (error: { code?: string; message: string }) =>
        error.code === "data_dir_in_use" && error.message.includes("SQLite database") && error.message.includes("PostgreSQL"),
    );
    // The refused start left its own data dir free: it can start on its own database.
    acquireServerLocks({ dataDir: path.join(root, "b"), address: "127.0.0.1:0", database: path.join(root, "b", "llmgw.db") }).release();
    // A server whose database is the first one's default file is refused too.
    assert.throws(
      () => acquireServerLocks({ dataDir: path.join(root, "b"), address: "127.0.0.1:0", database: path.join(root, "a", "llmgw.db") }),
      (error: { code?: string }) => error.code === "data_dir_in_use",
    );
    first.release();
    acquireServerLocks({ dataDir: path.join(root, "b"), address: "127.0.0.1:0", database }).release();
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
});
