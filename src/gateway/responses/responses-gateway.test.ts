// /v1/responses through a real llmgw server to fake OpenAI-compatible upstreams
// (test/support/fake-upstream.ts, standing in for any engine behind a replica), driven by
// the official openai client: the chat body the upstream receives, the response and the
// stream the SDK assembles, responses kept and chained with previous_response_id, the
// stored-response routes (GET, input_items, DELETE) per key, the usage row, and failures
// in OpenAI's shape: bad input, an unknown or another key's previous response, a stream
// broken mid-way (nothing kept).
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { startHarness, type Harness } from "../../../test/support/server-harness.ts";
import { fakeUpstreams, type FakeUpstream } from "../../../test/support/fake-upstream.ts";
import { eventually } from "../../../test/support/eventually.ts";

/** The text of a response's messages (the SDK adds `output_text` to created responses, not to a stream's final one). */
function textOf(response: { output: Array<{ type: string; content?: Array<{ type: string; text?: string }> }> }): string {
  return response.output
    .flatMap((item) => (item.type === "message" ? (item.content ?? []) : []))
    .map((part) => (part.type === "output_text" ? (part.text ?? "") : ""))
    .join("");
}

describe("/v1/responses through the gateway", () => {
  let harness: Harness;
  const upstreams = fakeUpstreams();
  let seen: FakeUpstream;
  let client: OpenAI;
  let other: OpenAI;

  /** An external model in front of a fake upstream (the harness fails the test if it is refused). */
  const addModel = (name: string, url: string) =>
    harness.addModel({ name, profiles: [{ name: "up", engine: "external", url: `${url}/v1`, upstream_model: `${name}-upstream` }] });

  before(async () => {
    harness = await startHarness();
    seen = await upstreams.start({ reply: "hello from the fake upstream" });
    await addModel("ext", seen.url);
    client = new OpenAI({ apiKey: await harness.clientKey(), baseURL: `${harness.url}/v1`, maxRetries: 0 });
    other = new OpenAI({ apiKey: await harness.clientKey(), baseURL: `${harness.url}/v1`, maxRetries: 0 });
  });

  after(async () => {
    await harness.close();
    await upstreams.closeAll();
  });

  test("a response: the upstream gets a chat completion; the SDK gets the response, which GET and input_items read back", async () => {
    const response = await client.responses.create({ model: "ext", instructions: "Be brief.", input: "Hi", max_output_tokens: 32, metadata: { run: "7" } });
    assert.deepEqual(seen.requests.at(-1)!.body, {
      model: "ext-upstream",
      messages: [
        { role: "system", content: "Be brief." },
        { role: "user", content: "Hi" },
      ],
      max_tokens: 32,
    });
    assert.match(response.id, /^resp_/);
    assert.equal(response.object, "response");
    assert.equal(response.status, "completed");
    assert.equal(response.model, "ext");
    assert.equal(response.output_text, "hello from the fake upstream");
    assert.deepEqual(response.metadata, { run: "7" });
    assert.equal(response.usage?.input_tokens, 7);
    assert.equal(response.usage?.output_tokens, 5);
    assert.equal(response.usage?.total_tokens, 12);

    const again = await client.responses.retrieve(response.id);
    assert.deepEqual(again.output, response.output);
    const items = await client.responses.inputItems.list(response.id);
    assert.equal(items.data.length, 1);
    const item = items.data[0]!;
    assert.equal(item.type === "message" ? JSON.stringify(item.content) : null, JSON.stringify([{ type: "input_text", text: "Hi" }]));
  });

  test("a stream: the SDK's stream helper gets every delta and the final response, which was kept before it ended", async () => {
    const stream = client.responses.stream({ model: "ext", input: "Hi" });
    const deltas: string[] = [];
    const types: string[] = [];
    stream.on("response.output_text.delta", (event) => deltas.push(event.delta));
    stream.on("event", (event) => types.push(event.type));
    const final = await stream.finalResponse();
    assert.deepEqual(deltas, ["hello", " from", " the", " fake", " upstream"]);
    assert.equal(textOf(final), "hello from the fake upstream");
    assert.equal(final.usage?.output_tokens, 5);
    assert.deepEqual(types.slice(0, 4), ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]);
    assert.equal(types.at(-1), "response.completed");
    assert.deepEqual(seen.requests.at(-1)!.body.stream_options, { include_usage: true });
    // Read at once: a client chaining on a streamed response finds it.
    assert.equal((await client.responses.retrieve(final.id)).output_text, "hello from the fake upstream");
  });

  test("previous_response_id continues the kept conversation; another key's or an unknown id is not found", async () => {
    const first = await client.responses.create({ model: "ext", input: "First question" });
    const second = await client.responses.create({ model: "ext", input: "Second question", previous_response_id: first.id });
    assert.deepEqual(seen.requests.at(-1)!.body.messages, [
      { role: "user", content: "First question" },
      { role: "assistant", content: "hello from the fake upstream" },
      { role: "user", content: "Second question" },
    ]);
    assert.equal(second.previous_response_id, first.id);
    await client.responses.create({ model: "ext", input: "Third", previous_response_id: second.id });
    assert.equal(seen.requests.at(-1)!.body.messages.length, 5, "the whole chain, oldest first");

    for (const [who, id] of [
      [other, first.id],
      [client, "resp_0000"],
    ] as const) {
      await assert.rejects(who.responses.create({ model: "ext", input: "x", previous_response_id: id }), (error: unknown) => {
        assert.ok(error instanceof OpenAI.NotFoundError, String(error));
        assert.equal(error.code, "previous_response_not_found");
        assert.equal(error.param, "previous_response_id");
        return true;
      });
    }
    await assert.rejects(other.responses.retrieve(first.id), OpenAI.NotFoundError, "another key cannot read it");
    await assert.rejects(other.responses.delete(first.id), OpenAI.NotFoundError, "nor delete it");
    await client.responses.delete(first.id);
    await assert.rejects(client.responses.retrieve(first.id), OpenAI.NotFoundError);
  });

  test("store: false keeps nothing", async () => {
    const response = await client.responses.create({ model: "ext", input: "Hi", store: false });
    assert.equal((response as unknown as { store: boolean }).store, false, "the response says it was not kept");
    await assert.rejects(client.responses.retrieve(response.id), OpenAI.NotFoundError);
    await assert.rejects(client.responses.create({ model: "ext", input: "x", previous_response_id: response.id }), OpenAI.NotFoundError);
  });

  test("bad input is a 400 naming the field, before any upstream is asked", async () => {
    const before = seen.requests.length;
    const refused = async (body: Record<string, unknown>, param: string, message: RegExp) => {
      await assert.rejects(client.responses.create({ model: "ext", input: "x", ...body } as never), (error: unknown) => {
        assert.ok(error instanceof OpenAI.BadRequestError, String(error));
        assert.equal(error.param, param);
        assert.match(error.message, message);
        return true;
      });
    };
    await refused({ tools: [{ type: "web_search" }] }, "tools.0.type", /built-in tool 'web_search' is not supported/);
    await refused({ input: [{ type: "computer_call", id: "c" }] }, "input[0].type", /items of type 'computer_call'/);
    await refused({ prompt: { id: "p" } }, "prompt", /not supported/);
    assert.equal(seen.requests.length, before);
    await assert.rejects(client.responses.create({ model: "nope", input: "x" }), OpenAI.NotFoundError);
  });

  test("each response leaves a usage row for /v1/responses; the stored routes leave none", async () => {
    const key = await harness.admin("POST", "/api/v1/keys", { name: "responses-usage" });
    const counted = new OpenAI({ apiKey: key.body.key, baseURL: `${harness.url}/v1`, maxRetries: 0 });
    const response = await counted.responses.create({ model: "ext", input: "Hi" });
    await counted.responses.retrieve(response.id);
    await counted.responses.create({ model: "ext", input: "Hi", stream: true }).then(async (stream) => {
      for await (const _event of stream) {
        // read to the end
      }
    });
    const rows = await eventually("two usage rows of the key", async () => {
      const found = await harness.server.store.db.selectFrom("usage").selectAll().where("key_id", "=", key.body.id).execute();
      return found.length >= 2 ? found : null;
    });
    assert.equal(rows.length, 2);
    assert.deepEqual(
      rows.map((row) => [row.endpoint, row.model, row.status, row.prompt_tokens, row.completion_tokens, row.stream]),
      [
        ["/v1/responses", "ext", 200, 7, 5, 0],
        ["/v1/responses", "ext", 200, 7, 5, 1],
      ],
    );
  });

  test("a stream broken mid-way ends with the error event the SDK raises, and nothing is kept", async () => {
    const broken = await upstreams.start({ reply: "one two three four", resetAfterChunks: 2 });
    await addModel("broken", broken.url);
    const stream = client.responses.stream({ model: "broken", input: "Hi" });
    const ids: string[] = [];
    stream.on("response.created", (event) => ids.push(event.response.id));
    await assert.rejects(stream.finalResponse());
    assert.equal(ids.length, 1);
    await assert.rejects(client.responses.retrieve(ids[0]!), OpenAI.NotFoundError);
  });
});
