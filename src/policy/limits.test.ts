// Budgets and rate limits through a real server: the official openai client against
// llmgw, `external` profiles pointing at fake OpenAI-compatible upstreams that report
// usage as an engine does, and a clock the test moves. Then two servers on one
// PostgreSQL sharing a key's budget and requests per minute.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import OpenAI from "openai";
import { startHarness, type Harness } from "../../test/support/server-harness.ts";
import { fakeUpstreams, type FakeUpstream } from "../../test/support/fake-upstream.ts";
import { eventually } from "../../test/support/eventually.ts";
import { Gate } from "../../test/support/gate.ts";
import { dropSchema, postgresProblem, TEST_POSTGRES_URL } from "../../test/support/stores.ts";
import type { CatalogModel } from "../catalog/catalog.ts";
import type { ApiKeyInfo } from "../keys/key-service.ts";
import { costUsd } from "./cost.ts";
import { worstCaseUsage, type KeyLimitsUse } from "./limits.ts";
import { tokenBound } from "./token-bound.ts";

const PRICES = { input_per_million: 1000, output_per_million: 2000 };
/** What the fake upstream reports for every chat answer: 7 prompt tokens, one per word of its reply. */
const REPLY = "one two three four five";
const ACTUAL_COST = costUsd(PRICES, { prompt_tokens: 7, completion_tokens: 5 });
const HI = { messages: [{ role: "user" as const, content: "hi" }], max_tokens: 10 };

/** The reservation of the HI request on a model: its worst case, as admission computes it. */
function reservation(model: CatalogModel, body: object = HI): { usd: number; tokens: number } {
  const bound = tokenBound("/v1/chat/completions", { model: model.name, ...body }, model);
  return { usd: costUsd(model.definition.prices, worstCaseUsage(bound, model.definition.prices)), tokens: bound.total };
}

/** A fixed instant in the middle of a minute, that tests move. */
function movableClock(start = Date.parse("2027-03-10T10:00:30.000Z")): { now: () => number; advance: (ms: number) => void } {
  let now = start;
  return { now: () => now, advance: (ms) => (now += ms) };
}

/**
 * GET /api/v1/keys/:name: the key and the use of its limits. A
 * key without a budget or a rate limit shows null there; the tests read only the limits a key has.
 */
interface KeyShown extends ApiKeyInfo {
  usage: {
    budget: NonNullable<KeyLimitsUse["budget"]>;
    rate: NonNullable<KeyLimitsUse["rate"]>;
    models: KeyLimitsUse["models"];
  };
}

async function keyUse(harness: Harness, name: string): Promise<KeyShown> {
  const shown = await harness.admin("GET", `/api/v1/keys/${name}`);
  assert.equal(shown.status, 200, JSON.stringify(shown.body));
  return shown.body;
}

function clientFor(harness: Harness, key: string): OpenAI {
  return new OpenAI({ apiKey: key, baseURL: `${harness.url}/v1`, maxRetries: 0 });
}

describe("budgets and rate limits on one server", () => {
  const upstreams = fakeUpstreams();
  const clock = movableClock();
  let harness: Harness;
  let upstream: FakeUpstream;
  let model: CatalogModel;

  before(async () => {
    harness = await startHarness({ limitsClock: clock.now });
    upstream = await upstreams.start({ reply: REPLY });
    model = await harness.addModel({
      name: "priced",
      prices: PRICES,
      profiles: [{ name: "p", engine: "external", url: upstream.url, max_inflight: 200 }],
      queue_size: 1000,
    });
  });
  after(async () => {
    await harness.close();
    await upstreams.closeAll();
  });

  test("100 requests at once against a budget for about 10: the reservations that fit run, the rest get insufficient_quota, and spent stays within the budget", async () => {
    const gate = new Gate();
    // trust_max_tokens: held JSON answers, as the test means (an untrusted server would be asked for a stream).
    const held = await upstreams.start({ reply: REPLY, beforeAnswer: gate.wait });
    const heldModel = await harness.addModel({
      name: "held-priced",
      prices: PRICES,
      profiles: [{ name: "p", engine: "external", url: held.url, trust_max_tokens: true, max_inflight: 200 }],
      queue_size: 1000,
    });
    const { usd: perRequest } = reservation(heldModel);
    const budget = Number((perRequest * 10.5).toFixed(6));
    const client = clientFor(harness, await harness.clientKey({ name: "budget-100", budget_usd: budget, budget_period: "day" }));
    let answered = 0;
    const outcomes = Array.from({ length: 100 }, () =>
      client.chat.completions.create({ model: "held-priced", ...HI }).then(
        () => "ok" as const,
        (error: unknown) => {
          answered += 1;
          return error;
        },
      ),
    );
    // Every admitted request is held at the upstream with its reservation until all others
    // are answered, so exactly the ten that fit are admitted, whatever their order.
    await eventually("10 requests at the upstream and 90 answered", () => gate.waiting === 10 && answered === 90);
    const inFlight = await keyUse(harness, "budget-100");
    assert.ok(Math.abs(inFlight.usage.budget.reserved_usd - 10 * perRequest) < 1e-6, JSON.stringify(inFlight.usage.budget));
    assert.ok(inFlight.usage.budget.reserved_usd + inFlight.usage.budget.spent_usd <= budget);
    gate.open();
    const results = await Promise.all(outcomes);
    assert.equal(results.filter((r) => r === "ok").length, 10);
    const refused = results.filter((r) => r !== "ok");
    assert.equal(refused.length, 90);
    for (const error of refused) {
      assert.ok(error instanceof OpenAI.RateLimitError, String(error));
      assert.equal(error.code, "insufficient_quota");
      assert.equal(error.type, "insufficient_quota");
    }
    const first = refused[0] as InstanceType<typeof OpenAI.RateLimitError>;
    assert.match(first.message, /key 'budget-100' has spent \$0 of its \$[\d.]+ budget for 2027-03-10 \(UTC\), and requests in flight hold/);
    assert.match(first.message, /resets at 2027-03-11T00:00:00.000Z/);
    assert.equal(first.headers.get("retry-after"), String((Date.parse("2027-03-11T00:00:00Z") - clock.now()) / 1000), "a daily budget says when it resets");
    // Settled: the reservations became the actual cost, which is far below.
    const settled = await eventually("the reservations to settle", async () => {
      const shown = await keyUse(harness, "budget-100");
      return shown.usage.budget.reserved_usd === 0 ? shown.usage.budget : null;
    });
    assert.ok(Math.abs(settled.spent_usd - 10 * ACTUAL_COST) < 1e-6, JSON.stringify(settled));
    assert.ok(settled.spent_usd <= budget);
    assert.equal(settled.resets_at, "2027-03-11T00:00:00.000Z");
    // Refused only because of the reservations in flight: the budget is not spent, and no event says it is.
    await harness.server.budgetAlerts.checkNow();
    const budgetEvents = (await harness.admin("GET", "/api/v1/events?kind=budget_exhausted,budget_threshold")).body.data.filter(
      (event: { data: { key?: string } }) => event.data.key === "budget-100",
    );
    assert.deepEqual(budgetEvents, []);
  });

  test("the rate headers are on every kind of answer to a limited key: a stream, and an error after admission", async () => {
    const failing = await upstreams.start({ reply: REPLY, failWithStatus: 400 });
    await harness.addModel({ name: "priced-failing", prices: PRICES, profiles: [{ name: "p", engine: "external", url: failing.url }] });
    const client = clientFor(harness, await harness.clientKey({ name: "headers-everywhere", rpm: 100 }));
    const { data: stream, response } = await client.chat.completions.create({ model: "priced", ...HI, stream: true }).withResponse();
    for await (const _chunk of stream) {
      // read to the end
    }
    assert.equal(response.headers.get("x-ratelimit-limit-requests"), "100");
    assert.equal(response.headers.get("x-ratelimit-remaining-requests"), "99");
    const refused = await client.chat.completions.create({ model: "priced-failing", ...HI }).catch((error: unknown) => error);
    assert.ok(refused instanceof OpenAI.BadRequestError, String(refused));
    assert.equal(refused.headers.get("x-ratelimit-limit-requests"), "100", "an upstream's own error relayed to a limited key");
    assert.equal(refused.headers.get("x-ratelimit-remaining-requests"), "98");
    // Nothing listens at port 1: the gateway's own 502, written by its error path.
    await harness.addModel({ name: "priced-unreachable", prices: PRICES, profiles: [{ name: "p", engine: "external", url: "http://127.0.0.1:1/v1" }] });
    const unreachable = await client.chat.completions.create({ model: "priced-unreachable", ...HI }).catch((error: unknown) => error);
    assert.ok(unreachable instanceof OpenAI.APIError && unreachable.status !== undefined && unreachable.status >= 500, String(unreachable));
    assert.equal(unreachable.headers?.get("x-ratelimit-limit-requests"), "100", "an error llmgw writes itself after admission");
  });

  test("rpm 5 with the openai client: every answer carries the rate headers, the 6th request in the minute raises RateLimitError, and the next minute admits again", async () => {
    const client = clientFor(harness, await harness.clientKey({ name: "rpm-5", rpm: 5, tpm: 100_000 }));
    const { tokens } = reservation(model);
    for (let i = 1; i <= 5; i += 1) {
      const { response } = await client.chat.completions.create({ model: "priced", ...HI }).withResponse();
      assert.equal(response.headers.get("x-ratelimit-limit-requests"), "5");
      assert.equal(response.headers.get("x-ratelimit-remaining-requests"), String(5 - i));
      assert.equal(response.headers.get("x-ratelimit-reset-requests"), "30s", "the clock stands 30 s before the end of its minute");
      assert.equal(response.headers.get("x-ratelimit-limit-tokens"), "100000");
      // Earlier requests settled to 12 tokens each (or are about to); this one counts its reservation.
      const remainingTokens = Number(response.headers.get("x-ratelimit-remaining-tokens"));
      assert.ok(remainingTokens <= 100_000 - tokens - (i - 1) * 12 && remainingTokens >= 100_000 - i * tokens, `remaining tokens ${remainingTokens}`);
      assert.equal(response.headers.get("x-ratelimit-reset-tokens"), "30s");
    }
    const sixth = await client.chat.completions.create({ model: "priced", ...HI }).then(
      () => assert.fail("the 6th request in the minute must be refused"),
      (error: unknown) => error,
    );
    assert.ok(sixth instanceof OpenAI.RateLimitError, String(sixth));
    assert.equal(sixth.code, "rate_limit_exceeded");
    assert.equal(sixth.headers.get("retry-after"), "30");
    assert.equal(sixth.headers.get("x-ratelimit-limit-requests"), "5");
    assert.equal(sixth.headers.get("x-ratelimit-remaining-requests"), "0");
    assert.equal(sixth.headers.get("x-ratelimit-reset-requests"), "30s");
    assert.ok(sixth.headers.get("x-ratelimit-remaining-tokens") !== null);
    assert.match(sixth.message, /requests per minute: limit 5, used 5/);
    const before = upstream.requests.length;
    clock.advance(30_000);
    const { response } = await client.chat.completions.create({ model: "priced", ...HI }).withResponse();
    assert.equal(response.headers.get("x-ratelimit-remaining-requests"), "4", "a new minute is a new window");
    assert.equal(response.headers.get("x-ratelimit-reset-requests"), "1m0s");
    assert.equal(upstream.requests.length, before + 1, "the refused request never reached the upstream");
  });

  test("tokens per minute count the reservation, then the actual tokens; a request that can never fit says what to change", async () => {
    const { tokens } = reservation(model);
    const client = clientFor(harness, await harness.clientKey({ name: "tpm", tpm: tokens * 2 }));
    await client.chat.completions.create({ model: "priced", ...HI });
    await eventually("the tokens to settle to the 12 used", async () => (await keyUse(harness, "tpm")).usage.rate.tokens === 12);
    const shown = await keyUse(harness, "tpm");
    assert.equal(shown.usage.rate.requests, 1);
    assert.equal(shown.usage.rate.tpm, tokens * 2);
    const tooBig = await client.chat.completions.create({ model: "priced", ...HI, max_tokens: tokens * 3 }).then(
      () => assert.fail("a request whose worst case is above the tpm must be refused"),
      (error: unknown) => error,
    );
    assert.ok(tooBig instanceof OpenAI.RateLimitError);
    assert.equal(tooBig.code, "rate_limit_exceeded");
    assert.match(tooBig.message, /can never be admitted\. Lower max_tokens/);
    assert.equal(tooBig.headers.get("x-should-retry"), "false");
    // The headers of a refusal by the first scope still say where the key stands.
    assert.equal(tooBig.headers.get("x-ratelimit-limit-tokens"), String(tokens * 2));
    assert.equal(tooBig.headers.get("x-ratelimit-remaining-tokens"), String(tokens * 2 - 12));
    assert.equal((await keyUse(harness, "tpm")).usage.rate.requests, 1, "a refused request is not counted");
  });

  test("a model's own limits for a key apply to that model only", async () => {
    await harness.addModel({ name: "other", profiles: [{ name: "p", engine: "external", url: upstream.url }] });
    const client = clientFor(harness, await harness.clientKey({ name: "per-model", model_limits: { priced: { rpm: 1 } } }));
    const { response } = await client.chat.completions.create({ model: "priced", ...HI }).withResponse();
    assert.equal(response.headers.get("x-ratelimit-remaining-requests"), "0");
    const second = await client.chat.completions.create({ model: "priced", ...HI }).catch((error: unknown) => error);
    assert.ok(second instanceof OpenAI.RateLimitError);
    assert.match(second.message, /on model 'priced'/);
    for (let i = 0; i < 3; i += 1) {
      const other = await client.chat.completions.create({ model: "other", ...HI }).withResponse();
      assert.equal(other.response.headers.get("x-ratelimit-limit-requests"), null, "no limit applies to this model, so no rate headers");
    }
  });

  test("limits on another name of a model (an adapter's served name, an alias) count requests by that name, and the model's still hold", async () => {
    await harness.addModel({ name: "named", aliases: ["named-too"], profiles: [{ name: "p", engine: "external", url: upstream.url }] });
    const client = clientFor(harness, await harness.clientKey({ name: "per-name", model_limits: { "named-too": { rpm: 1 }, named: { rpm: 2 } } }));
    await client.chat.completions.create({ model: "named-too", ...HI });
    const second = await client.chat.completions.create({ model: "named-too", ...HI }).catch((error: unknown) => error);
    assert.ok(second instanceof OpenAI.RateLimitError);
    assert.match(second.message, /on model 'named-too'/);
    // The model's own name is not limited by its other name's window, but the model's limit counts both.
    await client.chat.completions.create({ model: "named", ...HI });
    const fourth = await client.chat.completions.create({ model: "named", ...HI }).catch((error: unknown) => error);
    assert.ok(fourth instanceof OpenAI.RateLimitError, "2 requests reached 'named': the one by its other name counted too");
    assert.match(fourth.message, /on model 'named'/);
  });

  test("a key without limits gets no rate headers and leaves nothing in the limit tables", async () => {
    const key = await harness.clientKey({ name: "free" });
    const { response } = await clientFor(harness, key)
      .chat.completions.create({ model: "priced", ...HI })
      .withResponse();
    assert.equal(response.headers.get("x-ratelimit-limit-requests"), null);
    const info = await keyUse(harness, "free");
    assert.deepEqual(info.usage, { budget: null, rate: null, models: {} });
    const db = harness.server.store.db;
    assert.equal((await db.selectFrom("key_rate_windows").selectAll().where("key_id", "=", info.id).execute()).length, 0);
    assert.equal((await db.selectFrom("key_budgets").selectAll().where("key_id", "=", info.id).execute()).length, 0);
  });

  test("PATCH changes a key's limits for its next request; a wrong field is named", async () => {
    const client = clientFor(harness, await harness.clientKey({ name: "patched", rpm: 1 }));
    await client.chat.completions.create({ model: "priced", ...HI });
    assert.ok((await client.chat.completions.create({ model: "priced", ...HI }).catch((error: unknown) => error)) instanceof OpenAI.RateLimitError);
    const patched = await harness.admin("PATCH", "/api/v1/keys/patched", { rpm: 3, budget_usd: 5, budget_period: "month" });
    assert.equal(patched.status, 200, JSON.stringify(patched.body));
    assert.equal(patched.body.rpm, 3);
    assert.equal(patched.body.budget_usd, 5);
    const { response } = await client.chat.completions.create({ model: "priced", ...HI }).withResponse();
    assert.equal(response.headers.get("x-ratelimit-remaining-requests"), "1", "the new limit applies at once, with this minute's two requests counted");
    const shown = await keyUse(harness, "patched");
    assert.equal(shown.usage.budget.period_id, "2027-03");
    assert.equal(shown.usage.budget.limit_usd, 5);
    const wrong = await harness.admin("PATCH", "/api/v1/keys/patched", { budget_period: "week" });
    assert.equal(wrong.status, 400);
    assert.equal(wrong.body.error.param, "budget_period");
    const removed = await harness.admin("PATCH", "/api/v1/keys/patched", { rpm: null, budget_usd: null });
    assert.equal(removed.body.rpm, null);
    const free = await client.chat.completions.create({ model: "priced", ...HI }).withResponse();
    assert.equal(free.response.headers.get("x-ratelimit-limit-requests"), null, "a key whose limits were all removed is unlimited again");
  });

  test("a request no replica answered costs nothing; one whose JSON answer broke without token counts is charged the estimate, here its reservation", async () => {
    const refusing = await upstreams.start({ resetOnRequest: true });
    const broken = await upstreams.start({ resetMidBody: true });
    await harness.addModel({ name: "refusing", prices: PRICES, profiles: [{ name: "p", engine: "external", url: refusing.url }] });
    // trust_max_tokens: the JSON answer itself breaks (an untrusted server would be asked for a stream).
    const brokenModel = await harness.addModel({
      name: "broken",
      prices: PRICES,
      profiles: [{ name: "p", engine: "external", url: broken.url, trust_max_tokens: true }],
    });
    const client = clientFor(harness, await harness.clientKey({ name: "outcomes", budget_usd: 100 }));
    assert.ok((await client.chat.completions.create({ model: "refusing", ...HI }).catch((error: unknown) => error)) instanceof OpenAI.APIError);
    const afterRefused = await eventually("the refused request to settle", async () => {
      const budget = (await keyUse(harness, "outcomes")).usage.budget;
      return budget.reserved_usd === 0 ? budget : null;
    });
    assert.equal(afterRefused.spent_usd, 0);
    assert.equal(afterRefused.period, "total");
    assert.equal(afterRefused.resets_at, null);
    await client.chat.completions.create({ model: "broken", ...HI }).catch(() => undefined);
    const afterBroken = await eventually("the broken answer to settle", async () => {
      const budget = (await keyUse(harness, "outcomes")).usage.budget;
      return budget.reserved_usd === 0 && budget.spent_usd > 0 ? budget : null;
    });
    assert.ok(
      Math.abs(afterBroken.spent_usd - reservation(brokenModel).usd) < 1e-6,
      `charged ${afterBroken.spent_usd}, reserved ${reservation(brokenModel).usd}`,
    );
    const spend = await harness.server.limits.spentByKey();
    const row = spend.find((r) => r.key === "outcomes");
    assert.ok(row !== undefined && Math.abs(row.spent_usd - afterBroken.spent_usd) < 1e-9 && row.limit_usd === 100, JSON.stringify(spend));
    assert.match(row.prefix, /^llmgw-/, "each entry names the key's prefix too (names are not unique)");
  });

  test("both max-token fields: the larger one is reserved; without either, the upstream is told the reserved output as max_tokens", async () => {
    const recording = await upstreams.start({ reply: REPLY });
    const recordingModel = await harness.addModel({
      name: "recording",
      prices: PRICES,
      max_output: 500,
      profiles: [{ name: "p", engine: "external", url: recording.url }],
    });
    const sneaky = { messages: [{ role: "user" as const, content: "hi" }], max_tokens: 1, max_completion_tokens: 100_000 };
    const large = reservation(recordingModel, sneaky).usd;
    assert.ok(large > 100 * reservation(recordingModel, { ...sneaky, max_completion_tokens: 1 }).usd, "the large field prices the reservation");
    // A budget that holds requests of 1000 output tokens (reservations settle a few ms late: room for three) but not one of 100,000.
    const budget = Number((reservation(recordingModel, { ...sneaky, max_completion_tokens: 1000 }).usd * 3).toFixed(6));
    const client = clientFor(harness, await harness.clientKey({ name: "two-fields", budget_usd: budget }));
    const refused = await client.chat.completions.create({ model: "recording", ...sneaky }).catch((error: unknown) => error);
    assert.ok(refused instanceof OpenAI.RateLimitError, String(refused));
    assert.equal(refused.code, "insufficient_quota");
    assert.equal(refused.headers.get("x-should-retry"), "false", "the SDKs must not retry a spent budget");
    assert.equal(recording.requests.length, 0, "a refused request never reaches the upstream");
    await client.chat.completions.create({ model: "recording", messages: sneaky.messages, max_tokens: 1, max_completion_tokens: 1000 });
    assert.equal(recording.requests.length, 1);
    assert.equal(recording.requests[0]!.body.max_tokens, 1, "a value under the cap is sent as it is");
    assert.equal(recording.requests[0]!.body.max_completion_tokens, 1000);
    // No max-token field: the upstream gets the reserved output (the model's max_output) as max_tokens, so it cannot outgrow the reservation.
    await client.chat.completions.create({ model: "recording", messages: sneaky.messages });
    const capped = recording.requests[1]!.body;
    assert.equal(capped.max_tokens, 500);
    assert.equal(capped.max_completion_tokens, undefined, "a field the client did not send is not added");
    const spent = await eventually("both answers to settle", async () => {
      const use = (await keyUse(harness, "two-fields")).usage.budget;
      return use.reserved_usd === 0 ? use.spent_usd : null;
    });
    assert.ok(spent >= 2 * ACTUAL_COST - 1e-9, `spent ${spent} covers the usage the upstream reported (${2 * ACTUAL_COST})`);
  });

  test("a key with a tpm at the model's context length is admitted without max_tokens: prompt and output share one context", async () => {
    const contextModel = await harness.addModel({
      name: "ctx",
      prices: PRICES,
      context_length: 4096,
      profiles: [{ name: "p", engine: "external", url: upstream.url }],
    });
    const client = clientFor(harness, await harness.clientKey({ name: "ctx-tpm", tpm: 4096 }));
    const { response } = await client.chat.completions.create({ model: "ctx", messages: [{ role: "user", content: "hi" }] }).withResponse();
    assert.equal(response.status, 200);
    assert.equal(reservation(contextModel, { messages: [{ role: "user", content: "hi" }] }).tokens, 4096);
  });

  test("two PATCHes of different fields at once both take effect", async () => {
    await harness.clientKey({ name: "two-patches", rpm: 1 });
    // Called together, both read the key before either writes (the race a read-merge-write loses).
    await Promise.all([
      harness.server.keys.update("two-patches", { rpm: 7 }, "test"),
      harness.server.keys.update("two-patches", { budget_usd: 3, budget_period: "day" }, "test"),
    ]);
    const shown = await keyUse(harness, "two-patches");
    assert.equal(shown.rpm, 7);
    assert.equal(shown.budget_usd, 3);
    assert.equal(shown.budget_period, "day");
  });

  test("a total budget that is spent says so and how to raise it, without Retry-After", async () => {
    const client = clientFor(harness, await harness.clientKey({ name: "tiny-total", budget_usd: reservation(model).usd / 2 }));
    const refused = await client.chat.completions.create({ model: "priced", ...HI }).catch((error: unknown) => error);
    assert.ok(refused instanceof OpenAI.RateLimitError);
    assert.equal(refused.code, "insufficient_quota");
    assert.equal(refused.headers.get("retry-after"), null);
    assert.match(refused.message, /A total budget does not reset: an administrator can raise it with 'llmgw ctl key update tiny-total --budget USD'/);
  });
});

describe("two servers on one PostgreSQL", () => {
  const upstreams = fakeUpstreams();
  const clock = movableClock();
  const schema = `llmgw_test_${randomBytes(6).toString("hex")}`;
  let first: Harness | undefined;
  let second: Harness | undefined;
  let unreachable: string | null = null;

  before(async () => {
    unreachable = await postgresProblem();
    if (unreachable !== null) return;
    const database = { database: TEST_POSTGRES_URL, schema };
    first = await startHarness({ database, limitsClock: clock.now });
    second = await startHarness({ database, adminKey: first.adminKey, limitsClock: clock.now });
  });
  after(async () => {
    await second?.close();
    await first?.close();
    await upstreams.closeAll();
    if (unreachable === null) await dropSchema(schema);
  });

  test("share a key's budget and requests per minute", async (t) => {
    if (unreachable !== null) {
      if (process.env.LLMGW_REQUIRE_POSTGRES === "1") throw new Error(`PostgreSQL is required but not reachable: ${unreachable}`);
      t.skip(`PostgreSQL not reachable at ${TEST_POSTGRES_URL} (${unreachable})`);
      return;
    }
    const [a, b] = [first!, second!];
    const gate = new Gate();
    const upstream = await upstreams.start({ reply: REPLY, beforeAnswer: gate.wait });
    const model = await a.addModel({
      name: "shared",
      prices: PRICES,
      profiles: [{ name: "p", engine: "external", url: upstream.url, trust_max_tokens: true, max_inflight: 100 }],
    });
    await b.server.catalog.refresh();
    await eventually("the second server to route the model", () => b.server.replicas.forModel(model.id).length > 0);

    // Requests per minute: 7 in all, whichever server they reach.
    const rpmKey = await a.clientKey({ name: "shared-rpm", rpm: 7 });
    gate.open();
    const rpmResults = await Promise.all(
      Array.from({ length: 20 }, (_, i) =>
        clientFor(i % 2 === 0 ? a : b, rpmKey)
          .chat.completions.create({ model: "shared", ...HI })
          .then(
            () => "ok",
            (error: unknown) => error,
          ),
      ),
    );
    assert.equal(rpmResults.filter((r) => r === "ok").length, 7);
    for (const error of rpmResults.filter((r) => r !== "ok")) {
      assert.ok(error instanceof OpenAI.RateLimitError, String(error));
      assert.equal(error.code, "rate_limit_exceeded");
    }

    // A budget for about 4 reservations: held at the upstream, exactly 4 run across both.
    const holding = new Gate();
    const heldUpstream = await upstreams.start({ reply: REPLY, beforeAnswer: holding.wait });
    const heldModel = await a.addModel({
      name: "shared-held",
      prices: PRICES,
      profiles: [{ name: "p", engine: "external", url: heldUpstream.url, trust_max_tokens: true, max_inflight: 100 }],
    });
    await b.server.catalog.refresh();
    await eventually("the second server to route the held model", () => b.server.replicas.forModel(heldModel.id).length > 0);
    const budget = Number((reservation(heldModel).usd * 4.5).toFixed(6));
    const budgetKey = await a.clientKey({ name: "shared-budget", budget_usd: budget, budget_period: "month" });
    let answered = 0;
    const outcomes = Array.from({ length: 30 }, (_, i) =>
      clientFor(i % 2 === 0 ? a : b, budgetKey)
        .chat.completions.create({ model: "shared-held", ...HI })
        .then(
          () => "ok",
          (error: unknown) => {
            answered += 1;
            return error;
          },
        ),
    );
    await eventually("4 requests held at the upstream and 26 answered", () => holding.waiting === 4 && answered === 26);
    holding.open();
    const results = await Promise.all(outcomes);
    assert.equal(results.filter((r) => r === "ok").length, 4);
    assert.ok(results.filter((r) => r !== "ok").every((error) => error instanceof OpenAI.RateLimitError && error.code === "insufficient_quota"));
    const settled = await eventually("both servers' settlements", async () => {
      const shown = await keyUse(b, "shared-budget");
      return shown.usage.budget.reserved_usd === 0 ? shown.usage.budget : null;
    });
    assert.ok(settled.spent_usd <= budget);
    assert.ok(Math.abs(settled.spent_usd - 4 * ACTUAL_COST) < 1e-6, JSON.stringify(settled));
  });
});
