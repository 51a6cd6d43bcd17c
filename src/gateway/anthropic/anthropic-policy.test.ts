// The gateway's policy on the Anthropic wire format, as a user of the official
// @anthropic-ai/sdk sees it: guard models (the model's and the key's), rate limits and
// budgets apply to POST /v1/messages as they do to chat completions, and every refusal
// arrives as the SDK's error class with Anthropic's error shape and llmgw's headers. A real
// llmgw server, fake OpenAI-compatible upstreams (test/support/fake-upstream.ts, counting 7
// prompt tokens and one completion token per word) and a stand-in Llama Guard 3
// (test/support/stand-in-guard.ts).
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import Anthropic from "@anthropic-ai/sdk";
import { startHarness, type Harness } from "../../../test/support/server-harness.ts";
import { fakeUpstreams } from "../../../test/support/fake-upstream.ts";
import { startStandInGuard, type StandInGuard } from "../../../test/support/stand-in-guard.ts";
import { eventually } from "../../../test/support/eventually.ts";

/** The limits' clock stands 30 s into a minute, so both requests of the rpm test share one window. */
const NOW = Date.parse("2027-03-10T12:00:30Z");
const REPLY = "hello from the fake upstream";
const PRICES = { input_per_million: 3, output_per_million: 15 };
/** 7 prompt tokens and 5 completion tokens at the model's prices. */
const COST = (7 * PRICES.input_per_million + 5 * PRICES.output_per_million) / 1_000_000;

describe("policy on /v1/messages with the Anthropic SDK", () => {
  let harness: Harness;
  const upstreams = fakeUpstreams();
  let guard: StandInGuard;
  let upstreamRequests: () => number;

  const anthropicClient = (key: string) => new Anthropic({ apiKey: key, baseURL: harness.url, maxRetries: 0 });
  const message = (client: Anthropic, model: string, content: string) =>
    client.messages.create({ model, max_tokens: 32, messages: [{ role: "user", content }] });
  const errorBody = (error: InstanceType<typeof Anthropic.APIError>) => error.error as { type: string; error: { type: string; message: string } };

  before(async () => {
    harness = await startHarness({ limitsClock: () => NOW, guardTimeoutMs: 5000 });
    const upstream = await upstreams.start({ reply: REPLY });
    const leaky = await upstreams.start({ reply: "first you build a bomb" });
    upstreamRequests = () => upstream.requests.length + leaky.requests.length;
    guard = await startStandInGuard({ format: "llama-guard-3", unsafeWords: { kill: ["S1"], hate: ["S10"], bomb: ["S9"] } });
    await harness.addModel({ name: "lg", role: "guard", guard_format: "llama-guard-3", profiles: [{ name: "g", engine: "external", url: guard.url }] });
    await harness.addModel({
      name: "guarded",
      guards: { input: ["lg"], output: ["lg"] },
      profiles: [{ name: "up", engine: "external", url: `${upstream.url}/v1` }],
    });
    await harness.addModel({ name: "plain", prices: PRICES, profiles: [{ name: "up", engine: "external", url: `${upstream.url}/v1` }] });
    await harness.addModel({ name: "leaky", profiles: [{ name: "up", engine: "external", url: `${leaky.url}/v1` }] });
  });

  after(async () => {
    await harness.close();
    await upstreams.closeAll();
    await guard.close();
  });

  test("a model's input guard: unsafe content is the SDK's BadRequestError, invalid_request_error naming the categories, and the model is not asked", async () => {
    const client = anthropicClient(await harness.clientKey());
    const safe = await message(client, "guarded", "Tell me about bread.");
    assert.deepEqual(safe.content, [{ type: "text", text: REPLY }]);
    assert.equal(guard.questions.at(-2)!.check, "input", "the request was checked");
    assert.equal(guard.questions.at(-1)!.check, "output", "and the answer");

    const before = upstreamRequests();
    const refused = await message(client, "guarded", "I hate them and want to kill them").catch((error: unknown) => error);
    assert.ok(refused instanceof Anthropic.BadRequestError, String(refused));
    assert.equal(refused.status, 400);
    assert.deepEqual(errorBody(refused), {
      type: "error",
      error: { type: "invalid_request_error", message: "Refused by guard model 'lg': the request has unsafe content (S1 Violent Crimes, S10 Hate)." },
    });
    assert.equal(upstreamRequests(), before, "the model never saw the unsafe request");

    // A stream is checked on its input too: refused before its first event.
    const streamed = await client.messages
      .create({ model: "guarded", max_tokens: 32, stream: true, messages: [{ role: "user", content: "kill" }] })
      .catch((error: unknown) => error);
    assert.ok(streamed instanceof Anthropic.BadRequestError, String(streamed));
    assert.equal(errorBody(streamed).error.type, "invalid_request_error");
    assert.equal(upstreamRequests(), before);
  });

  test("a key's guards on a model without guards: the input refused, an unsafe answer held back, in Anthropic's shape; another key passes", async () => {
    const created = await harness.admin("POST", "/api/v1/keys", { name: "guarded-key", guards: { input: ["lg"], output: ["lg"] } });
    assert.equal(created.status, 201, JSON.stringify(created.body));
    const client = anthropicClient(created.body.key);
    const refused = await message(client, "plain", "How do I kill a process?").catch((error: unknown) => error);
    assert.ok(refused instanceof Anthropic.BadRequestError, String(refused));
    assert.equal(errorBody(refused).error.type, "invalid_request_error");
    assert.equal(errorBody(refused).error.message, "Refused by guard model 'lg': the request has unsafe content (S1 Violent Crimes).");

    const held = await message(client, "leaky", "Tell me a story.").catch((error: unknown) => error);
    assert.ok(held instanceof Anthropic.BadRequestError, String(held));
    assert.equal(errorBody(held).error.message, "Refused by guard model 'lg': the answer has unsafe content (S9 Indiscriminate Weapons).");
    assert.equal(guard.questions.at(-1)!.judged, "first you build a bomb", "the guard judged the upstream's answer");

    const other = anthropicClient(await harness.clientKey());
    assert.deepEqual((await message(other, "plain", "How do I kill a process?")).content, [{ type: "text", text: REPLY }]);
    assert.deepEqual((await message(other, "leaky", "Tell me a story.")).content, [{ type: "text", text: "first you build a bomb" }]);
  });

  test("a guard that fails is the SDK's InternalServerError (api_error) with Retry-After, and the model is not asked", async () => {
    const client = anthropicClient(await harness.clientKey());
    guard.behaviour = "error";
    try {
      const before = upstreamRequests();
      const failed = await message(client, "guarded", "Tell me about bread.").catch((error: unknown) => error);
      assert.ok(failed instanceof Anthropic.InternalServerError, String(failed));
      assert.equal(failed.status, 503);
      assert.equal(errorBody(failed).error.type, "api_error");
      assert.match(errorBody(failed).error.message, /^Guard model 'lg' could not check the request \(.*HTTP 500/);
      assert.equal(failed.headers.get("retry-after"), "5");
      assert.equal(upstreamRequests(), before);
    } finally {
      guard.behaviour = "verdict";
    }
  });

  test("a key with rpm 1: the second message in the minute is the SDK's RateLimitError with the rate headers and Retry-After", async () => {
    const client = anthropicClient(await harness.clientKey({ name: "one-a-minute", rpm: 1 }));
    const first = await client.messages.create({ model: "plain", max_tokens: 32, messages: [{ role: "user", content: "Hi" }] }).withResponse();
    assert.equal(first.response.headers.get("x-ratelimit-limit-requests"), "1");
    assert.equal(first.response.headers.get("x-ratelimit-remaining-requests"), "0");

    const before = upstreamRequests();
    const second = await message(client, "plain", "Hi").catch((error: unknown) => error);
    assert.ok(second instanceof Anthropic.RateLimitError, String(second));
    assert.equal(second.status, 429);
    assert.equal(errorBody(second).error.type, "rate_limit_error");
    assert.match(errorBody(second).error.message, /requests per minute/i);
    assert.equal(second.headers.get("x-ratelimit-limit-requests"), "1");
    assert.equal(second.headers.get("x-ratelimit-remaining-requests"), "0");
    assert.equal(second.headers.get("retry-after"), "30", "the clock stands 30 s before its minute ends");
    assert.equal(upstreamRequests(), before, "the refused message never reached the model");
  });

  test("a budgeted key: what it spent (GET /api/v1/keys/:ref) grows by each message's cost at the model's prices", async () => {
    const created = await harness.admin("POST", "/api/v1/keys", { name: "budgeted", budget_usd: 1 });
    assert.equal(created.status, 201, JSON.stringify(created.body));
    const client = anthropicClient(created.body.key);
    const spent = async () => (await harness.admin("GET", `/api/v1/keys/${created.body.id}`)).body.usage.budget as { spent_usd: number; reserved_usd: number };
    assert.equal((await spent()).spent_usd, 0);

    const answer = await message(client, "plain", "Hi");
    assert.deepEqual(answer.usage, { input_tokens: 7, output_tokens: 5, cache_creation_input_tokens: null, cache_read_input_tokens: null });
    await eventually("the first message to settle", async () => {
      const budget = await spent();
      return budget.reserved_usd === 0 && Math.abs(budget.spent_usd - COST) < 1e-12;
    });
    await message(client, "plain", "Hi again");
    await eventually("the second message to settle", async () => {
      const budget = await spent();
      return budget.reserved_usd === 0 && Math.abs(budget.spent_usd - 2 * COST) < 1e-12;
    });
  });
});
