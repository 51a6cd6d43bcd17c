// Ollama's API through a real llmgw server to fake OpenAI-compatible upstreams
// (test/support/fake-upstream.ts, standing in for any engine behind a replica), driven by
// the official ollama client: a key restricted to some models sees and uses only those
// (`name:latest` included, so a name tells it nothing of other models), the key's rate
// limit answers in Ollama's shape, each request leaves its usage row, a stream broken
// mid-way ends with the error line the client raises, and chunks no chat stream sends
// (null, a null choice) neither crash the server nor break the answer.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { Ollama } from "ollama";
import OpenAI from "openai";
import { startHarness, type Harness } from "../../../test/support/server-harness.ts";
import { fakeUpstreams } from "../../../test/support/fake-upstream.ts";
import { eventually } from "../../../test/support/eventually.ts";

/** An upstream whose chat stream is these raw SSE events, whatever is asked. */
async function rawStreamUpstream(events: string[]): Promise<{ url: string; close(): Promise<void> }> {
  const server = http.createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.end(events.join(""));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

function ollamaWith(harness: Harness, key: string): Ollama {
  return new Ollama({ host: harness.url, headers: { Authorization: `Bearer ${key}` } });
}

async function refusedWith(call: Promise<unknown>, status: number, message: RegExp): Promise<void> {
  await assert.rejects(call, (error: unknown) => {
    assert.equal((error as { name?: string }).name, "ResponseError", String(error));
    assert.equal((error as { status_code?: number }).status_code, status, String(error));
    assert.match((error as Error).message, message);
    return true;
  });
}

describe("Ollama's API through the gateway", () => {
  let harness: Harness;
  const upstreams = fakeUpstreams();
  let raw: Awaited<ReturnType<typeof rawStreamUpstream>>;

  /** An external model in front of a fake upstream (the harness fails the test if it is refused). */
  const addModel = (name: string, url: string) =>
    harness.addModel({ name, profiles: [{ name: "up", engine: "external", url: `${url}/v1`, upstream_model: `${name}-upstream` }] });

  before(async () => {
    harness = await startHarness();
    const fake = await upstreams.start({ reply: "hello from the fake upstream" });
    await addModel("ext", fake.url);
    await addModel("secret", fake.url);
    const broken = await upstreams.start({ reply: "one two three four", resetAfterChunks: 2 });
    await addModel("broken", broken.url);
    const chunk = (content: string) => `data: ${JSON.stringify({ choices: [{ index: 0, delta: { content }, finish_reason: null }] })}\n\n`;
    raw = await rawStreamUpstream([
      chunk("odd"),
      "data: null\n\n",
      `data: ${JSON.stringify({ choices: [null] })}\n\n`,
      `data: ${JSON.stringify({ choices: [{ index: 0, delta: { tool_calls: [null] } }] })}\n\n`,
      chunk(" chunks"),
      `data: ${JSON.stringify({ choices: [{ index: 0, delta: {}, finish_reason: "stop" }] })}\n\n`,
      `data: ${JSON.stringify({ choices: [], usage: { prompt_tokens: 3, completion_tokens: 2 } })}\n\n`,
      "data:[DONE]\n\n",
    ]);
    await addModel("odd", raw.url);
  });

  after(async () => {
    await harness.close();
    await upstreams.closeAll();
    await raw?.close();
  });

  test("a key restricted to some models lists, shows and uses only those; name:latest tells it nothing of the others", async () => {
    const ollama = ollamaWith(harness, await harness.clientKey({ allowed_models: ["ext"] }));
    const listed = await ollama.list();
    assert.deepEqual(
      listed.models.map((model) => model.name),
      ["ext"],
    );
    assert.deepEqual(
      (await ollama.ps()).models.map((model) => model.name),
      ["ext"],
    );
    const answer = await ollama.chat({ model: "ext:latest", messages: [{ role: "user", content: "Hi" }], stream: false });
    assert.equal(answer.message.content, "hello from the fake upstream");
    assert.equal(answer.model, "ext:latest", "the name as the client asked for it");
    // The same words for a model that exists and one that does not: the name as asked, never the catalog's.
    for (const name of ["secret:latest", "nothere:latest"]) {
      await refusedWith(ollama.chat({ model: name, messages: [{ role: "user", content: "Hi" }], stream: false }), 404, new RegExp(`'${name}'.*GET /api/tags`));
      await refusedWith(ollama.embed({ model: name, input: "x" }), 404, new RegExp(`'${name}'`));
    }
    await refusedWith(ollama.show({ model: "secret" }), 404, /not found/);
  });

  test("each request leaves a usage row for its Ollama route; the key's rate limit answers 429 in Ollama's shape", async () => {
    const key = await harness.admin("POST", "/api/v1/keys", { name: "ollama-usage", rpm: 3 });
    const ollama = ollamaWith(harness, key.body.key);
    await ollama.chat({ model: "ext", messages: [{ role: "user", content: "Hi" }], stream: false });
    let streamed = "";
    for await (const part of await ollama.generate({ model: "ext", prompt: "Hi", stream: true })) streamed += part.response;
    assert.equal(streamed, "hello from the fake upstream");
    await ollama.embed({ model: "ext", input: ["a", "b"] });
    await refusedWith(ollama.chat({ model: "ext", messages: [{ role: "user", content: "Hi" }], stream: false }), 429, /limit/i);
    const rows = await eventually("four usage rows of the key", async () => {
      const found = await harness.server.store.db.selectFrom("usage").selectAll().where("key_id", "=", key.body.id).orderBy("id").execute();
      return found.length >= 4 ? found : null;
    });
    assert.deepEqual(
      rows.map((row) => [row.endpoint, row.status, row.prompt_tokens, row.completion_tokens, row.stream]),
      [
        ["/api/chat", 200, 7, 5, 0],
        ["/api/generate", 200, 7, 5, 1],
        ["/api/embed", 200, 6, 0, 0],
        ["/api/chat", 429, null, null, 0],
      ],
    );
  });

  test("a stream broken mid-way ends with the error line the client raises, never a done line", async () => {
    const ollama = ollamaWith(harness, await harness.clientKey());
    const parts: Array<{ done: boolean }> = [];
    await assert.rejects(async () => {
      for await (const part of await ollama.chat({ model: "broken", messages: [{ role: "user", content: "Hi" }], stream: true })) parts.push(part);
    }, /failed in the middle of the answer/);
    assert.ok(parts.length > 0 && parts.every((part) => !part.done), JSON.stringify(parts));
  });

  test("chunks no chat stream sends are skipped: the answer completes, on Ollama's API and on the Responses API, and the server lives on", async () => {
    const key = await harness.clientKey();
    const ollama = ollamaWith(harness, key);
    let text = "";
    let last: { done: boolean; eval_count?: number } | undefined;
    for await (const part of await ollama.chat({ model: "odd", messages: [{ role: "user", content: "Hi" }], stream: true })) {
      text += part.message.content;
      last = part;
    }
    assert.equal(text, "odd chunks");
    assert.equal(last?.done, true, "data:[DONE] (no space) ends it as done");
    assert.equal(last?.eval_count, 2);
    const openai = new OpenAI({ apiKey: key, baseURL: `${harness.url}/v1`, maxRetries: 0 });
    const final = await openai.responses.stream({ model: "odd", input: "Hi" }).finalResponse();
    assert.equal(final.status, "completed");
    assert.equal((await openai.responses.retrieve(final.id)).status, "completed", "kept");
    const again = await ollama.chat({ model: "ext", messages: [{ role: "user", content: "Hi" }], stream: false });
    assert.equal(again.done, true);
  });
});
