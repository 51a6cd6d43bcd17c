// The edges of a non-stream request held to its bound by running it as a stream upstream
// (relay-assembled.ts), through a real server and a scripted upstream that answers exactly
// the bytes a test gives: a stream under another content type, one whose first event is
// past the bound, one that reports usage early, one that floods events without text, one
// that ends before [DONE], and a JSON answer given anyway.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { startHarness, type Harness } from "../../test/support/server-harness.ts";
import { eventually } from "../../test/support/eventually.ts";
import { costUsd } from "../policy/cost.ts";

/** What the scripted upstream answers next: a content type and the body's parts. */
interface Script {
  contentType: string;
  parts: string[];
  /** Close the connection after the parts instead of ending the answer. */
  reset?: boolean;
}

async function scriptedUpstream(): Promise<{ url: string; next: (script: Script) => void; requests: () => number; close: () => Promise<void> }> {
  let script: Script = { contentType: "application/json", parts: ["{}"] };
  let requests = 0;
  const server = http.createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      requests += 1;
      res.writeHead(200, { "content-type": script.contentType });
      for (const part of script.parts) res.write(part);
      if (script.reset === true) res.socket?.destroy();
      else res.end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    next: (next) => {
      script = next;
    },
    requests: () => requests,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

const PRICES = { input_per_million: 1, output_per_million: 1000 };
const ASK = { model: "scripted", messages: [{ role: "user", content: "Go." }], max_tokens: 2 };
const chunk = (delta: Record<string, unknown>, extra: Record<string, unknown> = {}) =>
  `data: ${JSON.stringify({ id: "c1", object: "chat.completion.chunk", created: 1, model: "up", choices: [{ index: 0, delta, finish_reason: null }], ...extra })}\n\n`;

describe("a non-stream request held to its bound at an untrusted server", () => {
  let harness: Harness;
  let upstream: Awaited<ReturnType<typeof scriptedUpstream>>;

  before(async () => {
    harness = await startHarness();
    upstream = await scriptedUpstream();
    await harness.addModel({ name: "scripted", prices: PRICES, profiles: [{ name: "p", engine: "external", url: upstream.url }] });
  });
  after(async () => {
    await harness.close();
    await upstream.close();
  });

  // biome-ignore lint/suspicious/noExplicitAny: the tests read both answer shapes (a chat completion and an error) from one helper.
  async function ask(name: string): Promise<{ status: number; body: any; spent: () => Promise<number> }> {
    const created = await harness.admin("POST", "/api/v1/keys", { name, budget_usd: 10 });
    const response = await fetch(`${harness.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${created.body.key}`, "content-type": "application/json" },
      body: JSON.stringify(ASK),
    });
    const body = await response.json();
    const spent = async () =>
      (
        await eventually(`${name} to settle`, async () => {
          const budget = (await harness.admin("GET", `/api/v1/keys/${name}`)).body.usage.budget;
          return budget.reserved_usd === 0 ? budget : null;
        })
      ).spent_usd as number;
    return { status: response.status, body, spent };
  }

  test("a stream sent as text/plain is held to the bound all the same", async () => {
    upstream.next({
      contentType: "text/plain",
      parts: [chunk({ role: "assistant", content: "a" }), chunk({ content: " b" }), chunk({ content: " c" }), "data: [DONE]\n\n"],
    });
    const { status, body } = await ask("plain");
    assert.equal(status, 200, JSON.stringify(body));
    assert.equal(body.choices[0].message.content, "a b");
    assert.equal(body.choices[0].finish_reason, "length");
  });

  test("a first event already past the bound: one empty choice, ended at the bound, charged no more than it", async () => {
    upstream.next({ contentType: "text/event-stream", parts: [chunk({ role: "assistant", content: "x".repeat(6000) }), "data: [DONE]\n\n"] });
    const { status, body, spent } = await ask("first-past");
    assert.equal(status, 200, JSON.stringify(body));
    assert.deepEqual(body.choices, [{ index: 0, message: { role: "assistant", content: "" }, logprobs: null, finish_reason: "length" }]);
    const charged = await spent();
    assert.ok(charged <= costUsd(PRICES, { prompt_tokens: 10_000, completion_tokens: 2 }), `charged ${charged}`);
  });

  test("usage reported early, then a flood past the bound: charged what passed, never past the bound", async () => {
    upstream.next({
      contentType: "text/event-stream",
      parts: [
        chunk({ role: "assistant" }, { usage: { prompt_tokens: 5, completion_tokens: 0 } }),
        chunk({ content: "a" }),
        chunk({ content: "y".repeat(10 * 1024) }),
        "data: [DONE]\n\n",
      ],
    });
    const { status, body, spent } = await ask("early-usage");
    assert.equal(status, 200, JSON.stringify(body));
    assert.equal(body.choices[0].message.content, "a");
    assert.ok(Math.abs((await spent()) - costUsd(PRICES, { prompt_tokens: 5, completion_tokens: 1 })) < 1e-9);
  });

  test("events without text cannot grow the held answer without end: 502 output_limit_exceeded, charged no more than the bound", async () => {
    const logprobsOnly = chunk({}, { choices: [{ index: 0, delta: {}, logprobs: { content: [{ token: "", logprob: -1, top_logprobs: [] }] } }] });
    upstream.next({ contentType: "text/event-stream", parts: [...Array.from({ length: 2000 }, () => logprobsOnly), "data: [DONE]\n\n"] });
    const { status, body, spent } = await ask("flood");
    assert.equal(status, 502, JSON.stringify(body));
    assert.equal(body.error.code, "output_limit_exceeded");
    assert.ok((await spent()) <= costUsd(PRICES, { prompt_tokens: 10_000, completion_tokens: 2 }));
  });

  test("a stream that ends before [DONE] is a failure before the answer: nothing sent, nothing charged", async () => {
    upstream.next({ contentType: "text/event-stream", parts: [chunk({ role: "assistant", content: "a" })], reset: true });
    const { status, body, spent } = await ask("unfinished");
    assert.equal(status, 502, JSON.stringify(body));
    assert.equal(await spent(), 0);
  });

  test("one JSON answer given anyway is relayed as it is and charged what it reports", async () => {
    const answer = {
      id: "j",
      object: "chat.completion",
      created: 1,
      model: "up",
      choices: [{ index: 0, message: { role: "assistant", content: "a b c d" }, finish_reason: "stop" }],
      usage: { prompt_tokens: 7, completion_tokens: 4, total_tokens: 11 },
    };
    upstream.next({ contentType: "application/json", parts: [JSON.stringify(answer)] });
    const { status, body, spent } = await ask("json-anyway");
    assert.equal(status, 200, JSON.stringify(body));
    assert.deepEqual(body, answer);
    assert.ok(Math.abs((await spent()) - costUsd(PRICES, { prompt_tokens: 7, completion_tokens: 4 })) < 1e-9);
  });
});
