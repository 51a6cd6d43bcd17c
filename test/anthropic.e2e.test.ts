// The Anthropic Messages API end to end, as a user of the official @anthropic-ai/sdk
// sees it: a server with the local agent running the bundled engine (`llmgw engine`) on a
// generated tiny model whose reply is a known script (" say hello world one good day",
// over and over, whatever the prompt), so stop sequences and max_tokens land on known
// words. Non-stream and stream (messages.stream() and finalMessage()), the system prompt,
// stop sequences, usage in the answer and in the usage row, and the SDK's error classes.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import Anthropic from "@anthropic-ai/sdk";
import { writeTinyLlamaGguf } from "../src/gguf/tiny-model.ts";
import { startHarnessWithAgent, type Harness } from "./support/server-harness.ts";
import { eventually } from "./support/eventually.ts";

const SCRIPT = ["▁say", "▁hello", "▁world", "▁one", "▁good", "▁day"];

describe("the Anthropic SDK through llmgw to the bundled engine", () => {
  let harness: Harness;
  let modelDir: string;
  let client: Anthropic;
  let keyId: string;

  /**
   * Greedy decoding, so the script is followed exactly. The SDK's types no longer list
   * `temperature`, but the Messages API takes it and the SDK sends what it is given.
   */
  const greedy = <T extends object>(params: T): T => ({ ...params, temperature: 0 });

  before(async () => {
    modelDir = mkdtempSync(path.join(tmpdir(), "llmgw-anthropic-"));
    const modelFile = path.join(modelDir, "scripted.gguf");
    await writeTinyLlamaGguf({ path: modelFile, embeddingLength: 32, layers: 1, replyScript: SCRIPT });
    ({ harness } = await startHarnessWithAgent({ supervisor: { backoff: { initialMs: 50, maxMs: 200 }, stopGraceMs: 3000 } }));
    const created = await harness.admin("POST", "/api/v1/models", {
      name: "scripted",
      source: { kind: "file", path: modelFile },
      profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 2048, parallel: 1 }],
    });
    assert.equal(created.status, 201, JSON.stringify(created.body));
    await eventually("model scripted ready", () => harness.server.replicas.all().some((r) => r.modelName === "scripted" && r.state === "ready"), {
      timeoutMs: 120_000,
    });
    const key = await harness.admin("POST", "/api/v1/keys", { name: "anthropic-client" });
    assert.equal(key.status, 201, JSON.stringify(key.body));
    keyId = key.body.id;
    client = new Anthropic({ apiKey: key.body.key, baseURL: harness.url, maxRetries: 0 });
  });

  after(async () => {
    await harness?.close();
    rmSync(modelDir, { recursive: true, force: true });
  });

  test("a message stops at max_tokens with the usage of the generation", { timeout: 60_000 }, async () => {
    const message = await client.messages.create(greedy({ model: "scripted", max_tokens: 4, messages: [{ role: "user" as const, content: "Hello" }] }));
    assert.match(message.id, /^msg_/);
    assert.equal(message.model, "scripted");
    assert.equal(message.content.length, 1);
    const block = message.content[0]!;
    assert.equal(block.type, "text");
    assert.equal(block.type === "text" ? block.text.trim() : null, "say hello world one");
    assert.equal(message.stop_reason, "max_tokens");
    assert.equal(message.stop_sequence, null);
    assert.equal(message.usage.output_tokens, 4);
    assert.ok(message.usage.input_tokens > 0, `input tokens counted: ${message.usage.input_tokens}`);
  });

  test("a stop sequence ends the text before it and is named as the stop_sequence", { timeout: 60_000 }, async () => {
    const message = await client.messages.create(
      greedy({ model: "scripted", max_tokens: 20, stop_sequences: ["never-there", "world"], messages: [{ role: "user" as const, content: "Hello" }] }),
    );
    const block = message.content[0];
    assert.equal(block?.type === "text" ? block.text.trim() : null, "say hello");
    assert.equal(message.stop_reason, "stop_sequence");
    assert.equal(message.stop_sequence, "world");
  });

  test("the system prompt reaches the model: it adds to the input tokens", { timeout: 60_000 }, async () => {
    const ask = (system?: string) =>
      client.messages.create(
        greedy({ model: "scripted", max_tokens: 2, messages: [{ role: "user" as const, content: "Hello" }], ...(system === undefined ? {} : { system }) }),
      );
    const without = await ask();
    const withSystem = await ask("You are a tiny test model. Answer with one good sentence.");
    assert.ok(withSystem.usage.input_tokens > without.usage.input_tokens + 8, `${withSystem.usage.input_tokens} > ${without.usage.input_tokens} + 8`);
  });

  test("a stream: messages.stream() delivers the text piece by piece and finalMessage() assembles it", { timeout: 60_000 }, async () => {
    const stream = client.messages.stream(
      greedy({ model: "scripted", max_tokens: 30, system: "Be brief.", stop_sequences: ["day"], messages: [{ role: "user" as const, content: "Hello" }] }),
    );
    const events: string[] = [];
    const pieces: string[] = [];
    stream.on("streamEvent", (event) => events.push(event.type));
    stream.on("text", (text) => pieces.push(text));
    const message = await stream.finalMessage();
    assert.deepEqual(events.slice(0, 2), ["message_start", "content_block_start"]);
    assert.deepEqual(events.slice(-3), ["content_block_stop", "message_delta", "message_stop"]);
    assert.ok(pieces.length >= 4, `several text deltas: ${JSON.stringify(pieces)}`);
    const block = message.content[0];
    assert.equal(block?.type === "text" ? block.text : null, pieces.join(""));
    assert.equal(pieces.join("").trim(), "say hello world one good");
    assert.equal(message.stop_reason, "stop_sequence");
    assert.equal(message.stop_sequence, "day");
    assert.equal(message.usage.output_tokens, 6, "five words and the token that held 'day'");
    assert.ok(message.usage.input_tokens > 0, "input tokens arrive with message_delta");
  });

  test("every request left a usage row with the key, /v1/messages and the token counts", { timeout: 60_000 }, async () => {
    const streamed = await client.messages
      .stream(greedy({ model: "scripted", max_tokens: 3, messages: [{ role: "user" as const, content: "Hi" }] }))
      .finalMessage();
    const rows = await eventually("usage rows of the key", async () => {
      const found = await harness.server.store.db.selectFrom("usage").selectAll().where("key_id", "=", keyId).execute();
      return found.length >= 6 ? found : undefined;
    });
    assert.ok(rows.every((row) => row.endpoint === "/v1/messages" && row.model === "scripted" && row.status === 200));
    const last = rows.at(-1)!;
    assert.equal(last.stream, 1);
    assert.equal(last.completion_tokens, 3);
    assert.equal(last.prompt_tokens, streamed.usage.input_tokens);
  });

  test("a wrong key is an AuthenticationError and an unknown model a NotFoundError", { timeout: 60_000 }, async () => {
    const stranger = new Anthropic({ apiKey: "sk-not-a-key", baseURL: harness.url, maxRetries: 0 });
    await assert.rejects(
      stranger.messages.create({ model: "scripted", max_tokens: 4, messages: [{ role: "user", content: "Hi" }] }),
      Anthropic.AuthenticationError,
    );
    await assert.rejects(
      client.messages.create({ model: "no-such-model", max_tokens: 4, messages: [{ role: "user", content: "Hi" }] }),
      Anthropic.NotFoundError,
    );
  });
});
