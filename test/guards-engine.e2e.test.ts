// The bundled engine as a guard model: a real server with its local node runs generated
// tiny GGUF models (src/gguf/tiny-model.ts) as guards of a serving model, so the guard's
// question goes through admission, the engine key and a real llama.cpp generation. One
// guard has random weights: its answer is no verdict, so the request is refused (fail
// closed) until the guard says guard_on_error allow. Two are scripted (tiny-model.ts's
// replyScript) to answer Llama Guard 3's words token by token: "safe" lets the request
// through; "unsafe" refuses it. (The script starts after the prompt's last token, the
// newline of the chat template, so a scripted reply cannot hold a newline of its own: the
// unsafe guard stops before its category line, which is still a refusal.)
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import OpenAI from "openai";
import { writeTinyLlamaGguf } from "../src/gguf/tiny-model.ts";
import { startHarnessWithAgent, type Harness } from "./support/server-harness.ts";
import { startFakeUpstream, type FakeUpstream } from "./support/fake-upstream.ts";
import { eventually } from "./support/eventually.ts";

let harness: Harness;
let upstream: FakeUpstream;
let modelDir: string;
let client: OpenAI;
let safeGuard: string;

/** Waits for a guard's replica; a timeout says what the model's health said last. */
async function waitReady(name: string): Promise<void> {
  let last: unknown;
  await eventually(
    `guard ${name} to be ready`,
    async () => {
      last = (await harness.admin("GET", `/api/v1/models/${name}/health`)).body;
      return (last as { state: string }).state === "ready";
    },
    { timeoutMs: 120_000 },
  ).catch((error: unknown) => {
    throw new Error(`${String(error)}; its health: ${JSON.stringify(last)}`);
  });
}

before(async () => {
  modelDir = mkdtempSync(path.join(tmpdir(), "llmgw-guard-engine-"));
  const randomGuard = path.join(modelDir, "random-guard.gguf");
  safeGuard = path.join(modelDir, "safe-guard.gguf");
  const unsafeGuard = path.join(modelDir, "unsafe-guard.gguf");
  await writeTinyLlamaGguf({ path: randomGuard, seed: 11 });
  await writeTinyLlamaGguf({ path: safeGuard, seed: 12, replyScript: ["s", "a", "f", "e", "<|im_end|>"] });
  await writeTinyLlamaGguf({ path: unsafeGuard, seed: 13, replyScript: ["u", "n", "s", "a", "f", "e", "<|im_end|>"] });
  // Guard questions are long prompts; the guard timeout must cover a CPU engine reading one on a busy machine.
  ({ harness } = await startHarnessWithAgent({ guardTimeoutMs: 60_000, supervisor: { stopGraceMs: 3000 } }));
  upstream = await startFakeUpstream({ reply: "hello from the fake upstream" });
  const guard = (name: string, file: string) => ({
    name,
    role: "guard",
    guard_format: "llama-guard-3",
    source: { kind: "file", path: file },
    profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 2048, parallel: 1 }],
  });
  await harness.addModel(guard("random-guard", randomGuard));
  await harness.addModel(guard("unsafe-guard", unsafeGuard));
  await harness.addModel({ name: "guarded", guards: { input: ["random-guard"] }, profiles: [{ name: "up", engine: "external", url: upstream.url }] });
  await harness.addModel({ name: "strict", guards: { input: ["unsafe-guard"] }, profiles: [{ name: "up", engine: "external", url: upstream.url }] });
  // The test machine may have two cores: one replica each, so the safe guard comes later.
  for (const name of ["random-guard", "unsafe-guard"]) {
    await waitReady(name);
  }
  client = new OpenAI({ apiKey: await harness.clientKey(), baseURL: `${harness.url}/v1`, maxRetries: 0, timeout: 120_000 });
});

after(async () => {
  await harness?.close();
  await upstream?.close();
  rmSync(modelDir, { recursive: true, force: true });
});

const ask = (model: string) => client.chat.completions.create({ model, messages: [{ role: "user", content: "Tell me about bread." }] });

test("a guard on the bundled engine that answers no verdict refuses with 503, and passes with guard_on_error allow", { timeout: 180_000 }, async () => {
  const refused = await ask("guarded").catch((error: unknown) => error);
  assert.ok(refused instanceof OpenAI.APIError && refused.status === 503, String(refused));
  assert.equal(refused.code, "guard_unavailable");
  assert.match(refused.message, /Guard model 'random-guard' could not check the request \(its answer is not a llama-guard-3 verdict/);
  assert.equal(upstream.requests.length, 0, "the serving model was not asked");

  assert.equal((await harness.admin("PATCH", "/api/v1/models/random-guard", { guard_on_error: "allow" })).status, 200);
  const answer = await ask("guarded");
  assert.equal(answer.choices[0]?.message.content, "hello from the fake upstream");
  assert.equal(upstream.requests.length, 1);
});

test("guards on the bundled engine: 'unsafe' refuses the request with 400, 'safe' passes it", { timeout: 240_000 }, async () => {
  const before = upstream.requests.length;
  const refused = await ask("strict").catch((error: unknown) => error);
  assert.ok(refused instanceof OpenAI.BadRequestError, String(refused));
  assert.equal(refused.code, "content_policy_violation");
  assert.equal(refused.message, "400 Refused by guard model 'unsafe-guard': the request has unsafe content (no category given).");
  assert.equal(upstream.requests.length, before, "the serving model was not asked");

  // The random guard makes room for the safe one.
  assert.equal((await harness.admin("DELETE", "/api/v1/models/guarded")).status, 200);
  assert.equal((await harness.admin("DELETE", "/api/v1/models/random-guard")).status, 200);
  await harness.addModel({
    name: "safe-guard",
    role: "guard",
    guard_format: "llama-guard-3",
    source: { kind: "file", path: safeGuard },
    profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 2048, parallel: 1 }],
  });
  await harness.addModel({ name: "checked", guards: { input: ["safe-guard"] }, profiles: [{ name: "up", engine: "external", url: upstream.url }] });
  await waitReady("safe-guard");
  const answer = await ask("checked");
  assert.equal(answer.choices[0]?.message.content, "hello from the fake upstream");
  assert.equal(upstream.requests.length, before + 1);
});

test("a request longer than the bundled guard's context is refused with 400, even with guard_on_error allow", { timeout: 120_000 }, async () => {
  // The safe guard (the previous test started it) reads 2048 tokens per request; its tiny
  // vocabulary spends about a token a character. 6000 characters are over that, yet under
  // what llmgw refuses up front, so the engine's own 400 is what says so.
  assert.equal((await harness.admin("PATCH", "/api/v1/models/safe-guard", { guard_on_error: "allow" })).status, 200);
  const before = upstream.requests.length;
  const long = "Tell me about bread. ".repeat(300);
  const refused = await client.chat.completions.create({ model: "checked", messages: [{ role: "user", content: long }] }).catch((error: unknown) => error);
  assert.ok(refused instanceof OpenAI.BadRequestError, String(refused));
  assert.equal(refused.code, "guard_input_too_long");
  assert.match(
    refused.message,
    /Guard model 'safe-guard' cannot read the whole request: .*\(its context is 2048 tokens\); the guard said: .*allows 2048 tokens per request/,
  );
  assert.equal(upstream.requests.length, before, "the serving model was not asked");
});
