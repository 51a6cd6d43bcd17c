// What a request costs as it ends (request-outcome.ts): the rule on its own, then through a
// real server with `external` profiles pointing at fake OpenAI-compatible upstreams and a
// stand-in Llama Guard 3 (test/support/), a key with a budget, and what the key's budget
// shows spent once the request settled: a client that leaves mid-stream, an upstream's
// own error relayed whole, a /v1/messages answer the output guard refused, a held answer
// that broke before the client got a byte.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { startHarness, type Harness } from "../../test/support/server-harness.ts";
import { fakeUpstreams } from "../../test/support/fake-upstream.ts";
import { startStandInGuard, type StandInGuard } from "../../test/support/stand-in-guard.ts";
import { eventually } from "../../test/support/eventually.ts";
import { Gate } from "../../test/support/gate.ts";
import { costUsd } from "../policy/cost.ts";
import type { RenderedError } from "../core/errors.ts";
import { NO_ATTEMPT, settlementOf, type AttemptOutcome } from "./request-outcome.ts";

/** Anthropic's error body, as /v1/messages answers a refusal or a failure. */
interface AnthropicErrorBody {
  type: "error";
  error: { type: string; message: string };
}

test("the rule: known tokens are charged; a replica's 2xx answer or part of one is charged the estimate (or keeps the reservation without one); its error answer or nothing costs nothing", () => {
  const usage = { prompt_tokens: 3, completion_tokens: 2 };
  const estimate = { prompt_tokens: 40, completion_tokens: 9 };
  const ended = (kind: AttemptOutcome["kind"], upstreamStatus = 200, upstreamByte = true): AttemptOutcome => ({ kind, upstreamStatus, upstreamByte });
  for (const outcome of [ended("answered"), ended("client-gone"), ended("answered", 500), ended("cut"), NO_ATTEMPT]) {
    assert.deepEqual(
      settlementOf(outcome, usage, () => estimate),
      { usage, answered: true, estimated: false },
      `${outcome.kind} ${outcome.upstreamStatus} with usage`,
    );
  }
  for (const kind of ["answered", "broken", "client-gone", "refused", "cut"] as const) {
    assert.deepEqual(
      settlementOf(ended(kind), null, () => estimate),
      { usage: estimate, answered: true, estimated: true },
      kind,
    );
    assert.deepEqual(settlementOf(ended(kind), null, null), { usage: null, answered: true, estimated: false }, `${kind} without an estimate`);
  }
  const nothing: AttemptOutcome[] = [
    NO_ATTEMPT,
    ended("failed-before-first-byte", 200, true),
    ended("answered", 502),
    ended("answered", 500),
    ended("answered", 400),
    ended("broken", 500),
    ended("client-gone", 200, false),
    ended("broken", 200, false),
  ];
  for (const outcome of nothing) {
    assert.deepEqual(
      settlementOf(outcome, null, () => estimate),
      { usage: null, answered: false, estimated: false },
      `${outcome.kind} ${outcome.upstreamStatus} byte ${outcome.upstreamByte}`,
    );
  }
});

const PRICES = { input_per_million: 1000, output_per_million: 2000 };
const HI = { messages: [{ role: "user", content: "Tell me a story." }], max_tokens: 10 };

describe("what a request costs as it ends", () => {
  const upstreams = fakeUpstreams();
  const gate = new Gate();
  let harness: Harness;
  let guard: StandInGuard;

  before(async () => {
    harness = await startHarness();
    guard = await startStandInGuard({ format: "llama-guard-3", unsafeWords: { bomb: ["S9"] } });
    await harness.addModel({ name: "lg", role: "guard", guard_format: "llama-guard-3", profiles: [{ name: "g", engine: "external", url: guard.url }] });
    const slow = await upstreams.start({ reply: "one two three four five", beforeNextChunk: gate.wait });
    const leaky = await upstreams.start({ reply: "first you build a bomb" });
    // Breaks both ways: mid-JSON, and after a first event when it is asked for a stream (a key with limits).
    const broken = await upstreams.start({ resetMidBody: true, resetAfterChunks: 1 });
    await harness.addModel({ name: "slow", prices: PRICES, profiles: [{ name: "p", engine: "external", url: slow.url }] });
    await harness.addModel({ name: "leaky", prices: PRICES, guards: { output: ["lg"] }, profiles: [{ name: "p", engine: "external", url: leaky.url }] });
    await harness.addModel({ name: "broken", prices: PRICES, profiles: [{ name: "p", engine: "external", url: broken.url }] });
    for (const status of [500, 502]) {
      const failing = await upstreams.start({ failWithStatus: status });
      // One replica: the failure cannot be retried elsewhere, so it is relayed whole.
      await harness.addModel({ name: `fails-${status}`, prices: PRICES, profiles: [{ name: "p", engine: "external", url: failing.url }] });
    }
  });
  after(async () => {
    gate.open();
    await harness.close();
    await guard.close();
    await upstreams.closeAll();
  });

  async function budgetOf(name: string): Promise<{ spent_usd: number; reserved_usd: number }> {
    const shown = await harness.admin("GET", `/api/v1/keys/${name}`);
    assert.equal(shown.status, 200, JSON.stringify(shown.body));
    return shown.body.usage.budget;
  }

  /** What the key spent once nothing is reserved any more (its one request settled). */
  async function settledSpend(name: string): Promise<number> {
    const budget = await eventually(`the request of ${name} to settle`, async () => {
      const seen = await budgetOf(name);
      return seen.reserved_usd === 0 ? seen : null;
    });
    return budget.spent_usd;
  }

  async function post(pathname: string, key: string, body: unknown, signal?: AbortSignal): Promise<Response> {
    return fetch(`${harness.url}${pathname}`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify(body),
      signal,
    });
  }

  test("a client that leaves a stream after its first chunk is charged the estimate (the usage would have come last): the text it got, within the reservation", async () => {
    const created = await harness.admin("POST", "/api/v1/keys", { name: "leaves", budget_usd: 100 });
    const key: string = created.body.key;
    const controller = new AbortController();
    const response = await post("/v1/chat/completions", key, { model: "slow", stream: true, ...HI }, controller.signal);
    assert.equal(response.status, 200);
    const reader = response.body!.getReader();
    const first = await reader.read();
    assert.match(new TextDecoder().decode(first.value), /"content":"one"/);
    const reserved = (await budgetOf("leaves")).reserved_usd;
    assert.ok(reserved > 0, "the stream holds a reservation while it runs");
    controller.abort();
    const spent = await settledSpend("leaves");
    const row = await eventually("the usage row", async () => {
      const rows = await harness.server.store.db.selectFrom("usage").selectAll().where("key_id", "=", created.body.id).execute();
      return rows[0];
    });
    assert.equal(row.estimated, 1, "the upstream reported no usage: the row says its counts are estimated");
    assert.equal(row.completion_tokens, 3, "the bytes of the text that passed ('one')");
    assert.ok(row.prompt_tokens !== null && row.prompt_tokens > 0);
    assert.ok(Math.abs(spent - costUsd(PRICES, { prompt_tokens: row.prompt_tokens, completion_tokens: 3 })) < 1e-9, `charged ${spent}`);
    assert.ok(spent > 0 && spent < reserved, `charged ${spent}, reserved ${reserved}`);
  });

  for (const status of [500, 502]) {
    test(`an upstream's own ${status} relayed whole costs nothing`, async () => {
      const name = `relayed-${status}`;
      const key = await harness.clientKey({ name, budget_usd: 100 });
      const response = await post("/v1/chat/completions", key, { model: `fails-${status}`, ...HI });
      assert.equal(response.status, status);
      assert.equal(((await response.json()) as RenderedError["body"]).error.message, "upstream failure", "the upstream's own answer");
      assert.equal(await settledSpend(name), 0);
    });
  }

  test("a /v1/messages answer the output guard refused is charged the tokens the upstream reported", async () => {
    const key = await harness.clientKey({ name: "refused-message", budget_usd: 100 });
    const response = await fetch(`${harness.url}/v1/messages`, {
      method: "POST",
      headers: { "x-api-key": key, "content-type": "application/json" },
      body: JSON.stringify({ model: "leaky", ...HI }),
    });
    assert.equal(response.status, 400);
    const refusal = (await response.json()) as AnthropicErrorBody;
    assert.equal(refusal.type, "error");
    assert.match(refusal.error.message, /Refused by guard model 'lg'/);
    // The fake upstream reports 7 prompt tokens and one completion token per word of its reply.
    const spent = await settledSpend("refused-message");
    assert.ok(Math.abs(spent - costUsd(PRICES, { prompt_tokens: 7, completion_tokens: 5 })) < 1e-9, `charged ${spent}`);
  });

  test("a held answer that broke before the client got a byte costs nothing, and its timing is not the request's", async () => {
    const created = await harness.admin("POST", "/api/v1/keys", { name: "held-broken", budget_usd: 100 });
    assert.equal(created.status, 201, JSON.stringify(created.body));
    const response = await fetch(`${harness.url}/v1/messages`, {
      method: "POST",
      headers: { "x-api-key": created.body.key, "content-type": "application/json" },
      body: JSON.stringify({ model: "broken", ...HI }),
    });
    assert.equal(response.status, 502);
    assert.equal(((await response.json()) as AnthropicErrorBody).type, "error");
    assert.equal(await settledSpend("held-broken"), 0);
    const row = await eventually("the usage row", async () => {
      const rows = await harness.server.store.db.selectFrom("usage").selectAll().where("key_id", "=", created.body.id).execute();
      return rows[0];
    });
    assert.equal(row.status, 502);
    assert.equal(row.ttft_ms, null, "no replica's answer reached the client");
  });
});
