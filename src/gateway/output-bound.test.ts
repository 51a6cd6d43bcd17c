// Budgets hold against an upstream that ignores max_tokens (output-meter.ts, relay.ts): the
// meter on its own, then the probes that broke the budget, through a real server whose
// `external` profiles point at fake upstreams (test/support/fake-upstream.ts answers every
// word of its reply whatever max_tokens says): 50 concurrent streams cut at the bound,
// answers charged in full with the key refused after, one server's overspend seen by
// another on PostgreSQL, an upstream that reports no usage, and a restricted key that
// cannot tell which models exist.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { startHarness, type Harness } from "../../test/support/server-harness.ts";
import { fakeUpstreams, type FakeUpstream } from "../../test/support/fake-upstream.ts";
import Anthropic from "@anthropic-ai/sdk";
import { eventually } from "../../test/support/eventually.ts";
import { dropSchema, postgresSchemaOrSkip } from "../../test/support/stores.ts";
import { costUsd } from "../policy/cost.ts";
import { estimatedJsonOutput, MAX_TOKEN_BYTES, OutputMeter } from "./output-meter.ts";

function event(delta: Record<string, unknown>, extra: Record<string, unknown> = {}): string {
  return `data: ${JSON.stringify({ id: "c", object: "chat.completion.chunk", choices: [{ index: 0, delta, finish_reason: null }], ...extra })}\n\n`;
}

/** Runs a stream through a meter in pieces of `size` bytes; what passed, and whether it was cut. */
function meterStream(stream: string, bound: number | null, size: number): { passed: string; exceeded: boolean; meter: OutputMeter } {
  const meter = new OutputMeter(bound);
  const bytes = Buffer.from(stream);
  const out: Buffer[] = [];
  for (let i = 0; i < bytes.length && !meter.exceeded; i += size) out.push(meter.push(bytes.subarray(i, i + size)));
  if (!meter.exceeded) out.push(meter.end());
  return { passed: Buffer.concat(out).toString(), exceeded: meter.exceeded, meter };
}

describe("the output meter", () => {
  const words = ["Hello", " wörld", " and", " more", " words"];
  const stream = [
    event({ role: "assistant", content: "" }),
    ...words.map((word) => event({ content: word })),
    event({}, { choices: [] }),
    "data: [DONE]\n\n",
  ].join("");

  test("an answer within its bound passes byte for byte, whatever the chunk boundaries", () => {
    for (const size of [1, 3, 17, 64, stream.length]) {
      const { passed, exceeded } = meterStream(stream, 5, size);
      assert.equal(exceeded, false, `pieces of ${size}`);
      assert.equal(passed, stream, `pieces of ${size}`);
    }
  });

  test("past the bound, the event that passes it and all after stay behind, and only whole events passed", () => {
    for (const size of [1, 5, 40, stream.length]) {
      const { passed, exceeded, meter } = meterStream(stream, 2, size);
      assert.equal(exceeded, true, `pieces of ${size}`);
      assert.equal(passed, event({ role: "assistant", content: "" }) + event({ content: "Hello" }) + event({ content: " wörld" }), `pieces of ${size}`);
      assert.equal(meter.countedOutput(), 2, "what passed");
    }
  });

  test("an upstream's own count in an event counts: one event of eight tokens passes, its usage past the bound does not", () => {
    const oneEvent = event({ content: "eight tokens in one event of text" }) + event({}, { choices: [], usage: { prompt_tokens: 4, completion_tokens: 8 } });
    const { passed, exceeded, meter } = meterStream(oneEvent, 1, 1000);
    assert.equal(exceeded, true);
    assert.equal(passed, event({ content: "eight tokens in one event of text" }));
    assert.equal(meter.reportedUsage(), null, "the count came with the event held back");
    assert.equal(meter.chargedWhenCut(8), 1, "a cut stream is charged no more than the bound");
  });

  test("events without text (the role, the finish, usage within the bound) count nothing; tool calls and reasoning count", () => {
    const calls =
      event({ role: "assistant" }) +
      event({ tool_calls: [{ index: 0, id: "t", type: "function", function: { name: "get", arguments: "" } }] }) +
      event({ tool_calls: [{ index: 0, function: { arguments: '{"a":1}' } }] }) +
      event({ reasoning_content: "hm" }) +
      event({}, { choices: [{ index: 0, delta: {}, finish_reason: "tool_calls" }] });
    const { exceeded, meter } = meterStream(calls, 3, 7);
    assert.equal(exceeded, false);
    assert.equal(meter.countedOutput(), 3);
    // The arguments count as sent, escaped ({\"a\":1} is 9 bytes for 7 of text): still an upper bound.
    assert.equal(meter.estimatedOutput(), 3, "held to the bound");
    assert.equal(meterStream(calls, null, 7).meter.estimatedOutput(), 3 + 9 + 2);
  });

  test("CRLF framing, comments and spaced JSON are read alike; text that looks like a key inside a string is not one", () => {
    const crlf = [
      ": keep-alive\r\n\r\n",
      'data: {"choices": [{"index": 0, "delta": {"content": "say \\"content\\":\\"x\\" here"}}]}\r\n\r\n',
      'event: message\r\ndata: {"choices":[{"index":0,"delta":{"content":"two"}}]}\r\n\r\n',
      "data: [DONE]\r\n\r\n",
    ].join("");
    for (const size of [1, 2, 7, crlf.length]) {
      const { passed, exceeded, meter } = meterStream(crlf, 2, size);
      assert.equal(exceeded, false, `pieces of ${size}`);
      assert.equal(passed, crlf, `pieces of ${size}`);
      assert.equal(meter.countedOutput(), 2, `pieces of ${size}`);
    }
    assert.equal(meterStream(crlf, 1, 5).exceeded, true, "the second text event passes a bound of one");
  });

  test("CR line ends (valid SSE) end events too; a lone CR at a chunk's end waits for a possible LF", () => {
    const cr = `${event({ content: "one" }).replaceAll("\n", "\r")}${event({ content: "two" }).replaceAll("\n", "\r")}${event({ content: "three" }).replaceAll("\n", "\r")}`;
    for (const size of [1, 4, cr.length]) {
      const { passed, exceeded, meter } = meterStream(cr, 2, size);
      assert.equal(exceeded, true, `pieces of ${size}`);
      assert.equal(passed, cr.slice(0, cr.indexOf("\r\r", cr.indexOf("\r\r") + 2) + 2), `pieces of ${size}`);
      assert.equal(meter.countedOutput(), 2);
    }
  });

  test("one event carrying much text counts at least its bytes over the longest token's", () => {
    const long = event({ content: "x".repeat(MAX_TOKEN_BYTES * 3 + 1) });
    const { passed, exceeded, meter } = meterStream(long, 3, 100);
    assert.equal(exceeded, true);
    assert.equal(passed, "");
    assert.equal(meter.countedOutput(), 0, "the event counts 4 tokens, so it never passed");
    assert.equal(meterStream(event({ refusal: "no" }), 0, 100).exceeded, true, "a refusal is text too");
  });

  test("a stream that never ends an event, or comes compressed, cannot be held to a bound: cut when bounded, passed when not", () => {
    const endless = `data: {"choices":[{"delta":{"content":"${"y".repeat(2 * 1024 * 1024)}`;
    const bounded = meterStream(endless, 5, 64 * 1024);
    assert.equal(bounded.exceeded, true);
    assert.match(bounded.meter.unreadable ?? "", /no event ended/);
    assert.equal(bounded.passed, "");
    const unbounded = meterStream(endless, null, 64 * 1024);
    assert.equal(unbounded.exceeded, false);
    assert.equal(unbounded.passed, endless, "passed whole, unmetered");
    const compressed = new OutputMeter(5);
    compressed.cannotRead("it came compressed (gzip)");
    assert.equal(compressed.exceeded, true);
    assert.equal(compressed.push(Buffer.from("anything")).length, 0);
  });

  test("the estimate is the UTF-8 bytes of the text, held to the bound unless the answer is provably longer", () => {
    assert.equal(meterStream(stream, null, 9).meter.estimatedOutput(), Buffer.byteLength(words.join("")));
    assert.equal(meterStream(stream, 50, 9).meter.estimatedOutput(), Buffer.byteLength(words.join("")));
    assert.equal(meterStream(stream, 5, 9).meter.estimatedOutput(), 5, "an honest stream is not charged past what it was asked for");
    const answer = (content: string) =>
      Buffer.from(JSON.stringify({ choices: [{ index: 0, message: { role: "assistant", content }, finish_reason: "stop" }] }));
    assert.equal(estimatedJsonOutput(answer("naïve answer"), 0, null), Buffer.byteLength("naïve answer"));
    assert.equal(estimatedJsonOutput(answer("naïve answer"), 0, 4), 4, "held to the bound");
    const long = "z".repeat(MAX_TOKEN_BYTES * 5);
    assert.equal(estimatedJsonOutput(answer(long), 0, 4), long.length, "provably longer than the bound: charged in full");
    assert.equal(estimatedJsonOutput(null, 11, null), 11, "an answer that cannot be read whole counts all its bytes");
    assert.equal(estimatedJsonOutput(Buffer.from('{"choices":[{"mess'), 300, 4), 4, "...held to the bound too");
  });
});

/** $1 a million prompt tokens, $1000 a million output tokens: the output is what costs. */
const PRICES = { input_per_million: 1, output_per_million: 1000 };
const EIGHT_WORDS = "a b c d e f g h";
const TINY = { messages: [{ role: "user", content: "Say one word." }], max_tokens: 1 };

describe("budgets against an upstream that ignores max_tokens", () => {
  const upstreams = fakeUpstreams();
  let harness: Harness;
  let ignoring: FakeUpstream;

  before(async () => {
    harness = await startHarness();
    ignoring = await upstreams.start({ reply: EIGHT_WORDS });
    const jsonOnly = await upstreams.start({ reply: EIGHT_WORDS, ignoreStream: true });
    const silent = await upstreams.start({ reply: "un deux trois", omitUsage: true });
    await harness.addModel({ name: "ignores", prices: PRICES, profiles: [{ name: "p", engine: "external", url: ignoring.url }] });
    await harness.addModel({ name: "trusted", prices: PRICES, profiles: [{ name: "p", engine: "external", url: ignoring.url, trust_max_tokens: true }] });
    await harness.addModel({ name: "json-only", prices: PRICES, profiles: [{ name: "p", engine: "external", url: jsonOnly.url }] });
    await harness.addModel({ name: "uncounted", prices: PRICES, profiles: [{ name: "p", engine: "external", url: silent.url }] });
    await harness.addModel({ name: "other", prices: PRICES, profiles: [{ name: "p", engine: "external", url: silent.url }] });
  });
  after(async () => {
    await harness.close();
    await upstreams.closeAll();
  });

  async function budgetOf(name: string, h = harness): Promise<{ spent_usd: number; reserved_usd: number; limit_usd: number }> {
    const shown = await h.admin("GET", `/api/v1/keys/${name}`);
    assert.equal(shown.status, 200, JSON.stringify(shown.body));
    return shown.body.usage.budget;
  }

  async function settled(name: string, h = harness) {
    return eventually(`the requests of ${name} to settle`, async () => {
      const seen = await budgetOf(name, h);
      return seen.reserved_usd === 0 ? seen : null;
    });
  }

  function post(key: string, body: unknown, h = harness): Promise<Response> {
    return fetch(`${h.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify(body),
    });
  }

  test("50 concurrent streams with max_tokens 1: each is cut after one token with output_limit_exceeded, and the spend stays within the budget", async () => {
    const key = await harness.clientKey({ name: "streams", budget_usd: 0.05 });
    const answers = await Promise.all(
      Array.from({ length: 50 }, async () => {
        const response = await post(key, { model: "ignores", stream: true, ...TINY });
        return { status: response.status, text: await response.text() };
      }),
    );
    const streamed = answers.filter((answer) => answer.status === 200);
    assert.ok(streamed.length > 0, "some streams were admitted");
    for (const { status, text } of answers) {
      if (status === 429) {
        assert.match(text, /insufficient_quota/);
        continue;
      }
      assert.equal(status, 200, text);
      assert.match(text, /"code":"output_limit_exceeded"/, text);
      assert.doesNotMatch(text, /\[DONE\]/, "a cut stream never looks complete");
      const contents = [...text.matchAll(/"content":"([^"]*)"/g)].map((match) => match[1]).filter((content) => content !== "");
      assert.deepEqual(contents, ["a"], "exactly the one token reserved reached the client");
    }
    const budget = await settled("streams");
    assert.ok(budget.spent_usd > 0, "the streams were charged");
    assert.ok(budget.spent_usd <= 0.05 + 1e-12, `spent ${budget.spent_usd} of a $0.05 budget`);
  });

  test("the OpenAI SDK raises the cut as an APIError with code output_limit_exceeded", async () => {
    const client = new OpenAI({ baseURL: `${harness.url}/v1`, apiKey: await harness.clientKey({ name: "sdk", budget_usd: 1 }), maxRetries: 0 });
    const stream = await client.chat.completions.create({ model: "ignores", stream: true, ...TINY } as OpenAI.ChatCompletionCreateParamsStreaming);
    const seen: string[] = [];
    await assert.rejects(
      (async () => {
        for await (const chunk of stream) seen.push(chunk.choices[0]?.delta.content ?? "");
      })(),
      (error: unknown) => error instanceof OpenAI.APIError && (error.error as { code?: string } | undefined)?.code === "output_limit_exceeded",
    );
    assert.equal(seen.join(""), "a");
  });

  test("50 concurrent non-stream requests with max_tokens 1: each runs as a stream upstream and is stopped at one token (finish_reason length), and the spend stays within the budget", async () => {
    const key = await harness.clientKey({ name: "answers-together", budget_usd: 0.05 });
    const answers = await Promise.all(
      Array.from({ length: 50 }, async () => {
        const response = await post(key, { model: "ignores", ...TINY });
        return { status: response.status, body: (await response.json()) as { choices?: Array<{ message: { content: string }; finish_reason: string }> } };
      }),
    );
    const answered = answers.filter((answer) => answer.status === 200);
    assert.ok(answered.length > 0, "some requests were admitted");
    for (const { status, body } of answers) {
      if (status === 429) continue;
      assert.equal(status, 200, JSON.stringify(body));
      assert.equal(body.choices?.[0]?.message.content, "a", "the one token reserved");
      assert.equal(body.choices?.[0]?.finish_reason, "length", "as an upstream that kept to max_tokens answers");
    }
    assert.equal(ignoring.requests.at(-1)?.body.stream, true, "the upstream was asked for a stream");
    const budget = await settled("answers-together");
    assert.ok(budget.spent_usd > 0 && budget.spent_usd <= 0.05 + 1e-12, `spent ${budget.spent_usd} of a $0.05 budget`);
  });

  test("the Anthropic SDK's non-stream message is stopped the same way: stop_reason max_tokens", async () => {
    const client = new Anthropic({ baseURL: harness.url, apiKey: await harness.clientKey({ name: "anthropic", budget_usd: 1 }), maxRetries: 0 });
    const message = await client.messages.create({ model: "ignores", max_tokens: 1, messages: [{ role: "user", content: "Say one word." }] });
    assert.equal(message.stop_reason, "max_tokens");
    assert.deepEqual(
      message.content.map((block) => (block.type === "text" ? block.text : block.type)),
      ["a"],
    );
  });

  test("a profile with trust_max_tokens is sent the request as it is, and charged what it reports", async () => {
    const created = await harness.admin("POST", "/api/v1/keys", { name: "trusting", budget_usd: 1 });
    const response = await post(created.body.key, { model: "trusted", ...TINY });
    assert.equal(response.status, 200);
    assert.equal(((await response.json()) as { choices: Array<{ message: { content: string } }> }).choices[0]!.message.content, EIGHT_WORDS);
    assert.notEqual(ignoring.requests.at(-1)?.body.stream, true, "asked for one JSON answer");
    const budget = await settled("trusting");
    assert.ok(Math.abs(budget.spent_usd - costUsd(PRICES, { prompt_tokens: 7, completion_tokens: 8 })) < 1e-9, `charged ${budget.spent_usd}`);
    const refused = await harness.admin("POST", "/api/v1/models", {
      name: "bad-trust",
      profiles: [{ name: "p", engine: "llamacpp", trust_max_tokens: true }],
    });
    assert.equal(refused.status, 400, JSON.stringify(refused.body));
    assert.match(refused.body.error.message, /trust_max_tokens.*external/);
  });

  test("an upstream that answers one JSON body even when asked to stream cannot be stopped: its answer is charged in full, the key is refused from then on, and budget_exceeded says by how much", async () => {
    const created = await harness.admin("POST", "/api/v1/keys", { name: "answers", budget_usd: 0.05 });
    const key: string = created.body.key;
    // The fake upstream reports 7 prompt tokens and 8 of output for every answer.
    const charge = costUsd(PRICES, { prompt_tokens: 7, completion_tokens: 8 });
    let answered = 0;
    for (;;) {
      const response = await post(key, { model: "json-only", ...TINY });
      if (response.status === 429) {
        const refusal = (await response.json()) as { error: { code: string } };
        assert.equal(refusal.error.code, "insufficient_quota");
        break;
      }
      assert.equal(response.status, 200);
      assert.equal(((await response.json()) as { choices: Array<{ message: { content: string } }> }).choices[0]!.message.content, EIGHT_WORDS);
      answered += 1;
      assert.ok(answered < 20, "the key is refused once it went over");
    }
    const budget = await settled("answers");
    assert.ok(Math.abs(budget.spent_usd - answered * charge) < 1e-9, `each answer charged in full: ${budget.spent_usd} for ${answered}`);
    assert.ok(budget.spent_usd > 0.05, "the last answer took it over");
    assert.ok(budget.spent_usd - 0.05 <= charge, "over by no more than one request's excess");
    assert.equal((await post(key, { model: "json-only", ...TINY })).status, 429, "still refused");
    const events = await eventually("the budget_exceeded event", async () => {
      const listed = await harness.admin("GET", "/api/v1/events?kind=budget_exceeded");
      return listed.body.data.find((e: { data: { key_id: string } }) => e.data.key_id === created.body.id);
    });
    assert.ok(Math.abs(events.data.over_usd - (budget.spent_usd - 0.05)) < 1e-9, JSON.stringify(events.data));
    assert.match(events.message, /went over its total budget by \$/);
  });

  test("an answer without reported usage is charged an estimate, marked estimated in the usage row and API, never 0", async () => {
    const created = await harness.admin("POST", "/api/v1/keys", { name: "uncounted", budget_usd: 1 });
    const key: string = created.body.key;
    assert.equal((await post(key, { model: "uncounted", max_tokens: 20, messages: [{ role: "user", content: "Count." }] })).status, 200);
    const streamed = await post(key, { model: "uncounted", stream: true, max_tokens: 20, messages: [{ role: "user", content: "Count." }] });
    assert.match(await streamed.text(), /\[DONE\]/);
    const rows = await eventually("two usage rows", async () => {
      const found = await harness.server.store.db.selectFrom("usage").selectAll().where("key_id", "=", created.body.id).orderBy("id").execute();
      return found.length === 2 ? found : null;
    });
    for (const row of rows) {
      assert.equal(row.estimated, 1);
      assert.equal(row.completion_tokens, Buffer.byteLength("un deux trois"), "the bytes of the text");
      assert.ok(row.prompt_tokens !== null && row.prompt_tokens > 0);
      assert.ok(row.cost_usd !== null && row.cost_usd > 0);
    }
    const budget = await settled("uncounted");
    const rowsCost = rows.reduce((sum, row) => sum + (row.cost_usd ?? 0), 0);
    assert.ok(Math.abs(budget.spent_usd - rowsCost) < 1e-9, "the budget is charged what the rows say");
    const report = await eventually("the usage report", async () => {
      const answer = await harness.admin("GET", "/api/v1/usage?key=uncounted");
      return answer.body.total.requests === 2 ? answer.body.total : null;
    });
    assert.equal(report.estimated_requests, 2);
  });

  test("a restricted key gets the same 404 for a model it may not use as for one that does not exist", async () => {
    const key = await harness.clientKey({ name: "restricted", allowed_models: ["uncounted"] });
    const forbidden = await post(key, { model: "other", messages: [{ role: "user", content: "hi" }] });
    const missing = await post(key, { model: "nothing-here", messages: [{ role: "user", content: "hi" }] });
    assert.equal(forbidden.status, 404);
    assert.equal(missing.status, 404);
    const [a, b] = [(await forbidden.json()) as { error: Record<string, unknown> }, (await missing.json()) as { error: Record<string, unknown> }];
    assert.deepEqual(
      { ...a.error, message: String(a.error.message).replace("other", "X") },
      { ...b.error, message: String(b.error.message).replace("nothing-here", "X") },
    );
    assert.equal((await post(key, { model: "uncounted", messages: [{ role: "user", content: "hi" }] })).status, 200);
  });
});

test("across servers on PostgreSQL: an overspend on one server refuses the key on the other", async (t) => {
  const database = await postgresSchemaOrSkip(t);
  if (database === null) return;
  const upstreams = fakeUpstreams();
  const first = await startHarness({ database });
  const second = await startHarness({ database, adminKey: first.adminKey });
  try {
    // An upstream that answers JSON even when asked to stream: the one kind whose excess cannot be stopped.
    const ignoring = await upstreams.start({ reply: EIGHT_WORDS, ignoreStream: true });
    await first.addModel({ name: "ignores", prices: PRICES, profiles: [{ name: "p", engine: "external", url: ignoring.url }] });
    const created = await first.admin("POST", "/api/v1/keys", { name: "shared", budget_usd: 0.01 });
    const ask = (h: Harness) =>
      fetch(`${h.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${created.body.key}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "ignores", ...TINY }),
      });
    assert.equal((await ask(first)).status, 200);
    assert.equal((await ask(first)).status, 200, "$0.008 spent: room for one more reservation");
    const charge = costUsd(PRICES, { prompt_tokens: 7, completion_tokens: 8 });
    const spent = await eventually("both settled in the shared database", async () => {
      const shown = await second.admin("GET", "/api/v1/keys/shared");
      const budget = shown.body.usage.budget;
      return budget.reserved_usd === 0 && Math.abs(budget.spent_usd - 2 * charge) < 1e-9 ? budget.spent_usd : null;
    });
    assert.ok(spent > 0.01 && spent - 0.01 <= charge, `over by at most one request's excess: ${spent}`);
    await eventually("the second server to know the model", async () => second.server.catalog.resolve("ignores") ?? null);
    const refused = await ask(second);
    assert.equal(refused.status, 429);
    assert.match(await refused.text(), /insufficient_quota/);
  } finally {
    await second.close();
    await first.close();
    await upstreams.closeAll();
    await dropSchema(database.schema);
  }
});
