// LoRA adapters on the bundled engine, in process on the bundled llama.cpp with a generated
// tiny model and generated adapters (src/gguf/tiny-lora.ts): a request without `lora` is
// the base (token for token what an engine without adapters generates), an adapter changes
// the greedy tokens, a request's adapters never leak into the next request's answer,
// unknown ids and bad scales are 400s naming the field, the bound on adapter contexts
// (replace an idle one, refuse with a retryable 503 while all are busy), and an adapter
// llama.cpp refuses fails the load with its reason and the file, and an adapter context
// decoding beside the base leaves each all of its threads.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { AddressInfo } from "node:net";
import type { Token } from "node-llama-cpp";
import OpenAI, { APIError } from "openai";
import { BadRequestError, UnavailableError } from "../../core/errors.ts";
import { silentLogger } from "../../core/log.ts";
import { profileSchema } from "../../catalog/model-schema.ts";
import { writeTinyLlamaGguf } from "../../gguf/tiny-model.ts";
import { writeTinyLora } from "../../gguf/tiny-lora.ts";
import { AdapterLanes, createLane, type Lane, type LaneShape } from "./adapter-lanes.ts";
import { DecodeBatchMeter } from "./decode-batches.ts";
import { DecodeLockstep } from "./decode-lockstep.ts";
import { createEngineServer, type EngineServer } from "./engine-server.ts";
import { llamaCppLaunch } from "./engine-launch.ts";
import { openModel } from "./llama-load.ts";
import { AdapterLoadError, LlamaRunner, type GenerateOptions } from "./llama-runner.ts";
import type { AdapterScale, GenerationParams } from "./openai-wire.ts";
import { SequencePool } from "./sequence-pool.ts";

let dir: string;
let modelPath: string;
let adapterA: string;
let adapterB: string;
/** The base model with no adapters at all. */
let plain: LlamaRunner;
/** The same model with adapters A (id 0) and B (id 1), and room for one adapter context. */
let adapted: LlamaRunner;
let server: EngineServer;
let client: OpenAI;

// " hello world" in the tiny vocabulary; token prompts tokenise alike on every engine.
const PROMPT = [297, 302];

before(async () => {
  dir = await mkdtemp(join(tmpdir(), "llmgw-adapters-"));
  modelPath = (await writeTinyLlamaGguf({ path: join(dir, "base.gguf"), seed: 7, textOnly: true })).path;
  adapterA = (await writeTinyLora({ path: join(dir, "a.gguf"), seed: 1 })).path;
  adapterB = (await writeTinyLora({ path: join(dir, "b.gguf"), seed: 2 })).path;
  const common = { modelPath, contextSize: 512, parallel: 1, threads: 1, logger: silentLogger() };
  plain = await LlamaRunner.load(common);
  adapted = await LlamaRunner.load({ ...common, adapterPaths: [adapterA, adapterB], maxAdapterContexts: 1 });
  server = createEngineServer({ key: "k", modelName: "tiny", logger: silentLogger() });
  server.setGenerator(adapted);
  const address: AddressInfo = await server.listen("127.0.0.1", 0);
  client = new OpenAI({ baseURL: `http://127.0.0.1:${address.port}/v1`, apiKey: "k", maxRetries: 0 });
});

after(async () => {
  await server?.shutdown(1000);
  await plain?.dispose();
  await adapted?.dispose();
  await rm(dir, { recursive: true, force: true });
});

const params = (lora?: AdapterScale[], maxTokens = 8): GenerationParams => ({ temperature: 0, stop: [], maxTokens, ...(lora ? { lora } : {}) });
const options = (lora?: AdapterScale[], extra: Partial<GenerateOptions> = {}): GenerateOptions => ({
  params: params(lora),
  signal: new AbortController().signal,
  ...extra,
});
const greedy = async (runner: LlamaRunner, lora?: AdapterScale[]): Promise<string> => (await runner.complete(PROMPT, options(lora))).text;

test("a request without lora is the base: the same greedy text as an engine without adapters, also with lora [] or only zero scales", async () => {
  const base = await greedy(plain);
  assert.equal(base.length > 0, true);
  assert.equal(await greedy(adapted), base);
  assert.equal(await greedy(adapted, []), base);
  assert.equal(await greedy(adapted, [{ id: 0, scale: 0 }]), base);
  assert.equal(adapted.adapterContexts, 0, "the base needs no adapter context");
  const chat = [{ role: "user" as const, content: "hello world" }];
  assert.equal((await adapted.chat(chat, options())).text, (await plain.chat(chat, options())).text);
});

test("an adapter changes the greedy text, repeatably; another adapter or scale changes it differently; the base is untouched after them", async () => {
  const base = await greedy(plain);
  const withA = await greedy(adapted, [{ id: 0, scale: 1 }]);
  assert.notEqual(withA, base);
  assert.equal(await greedy(adapted, [{ id: 0, scale: 1 }]), withA, "the same adapter and scale: the same tokens");
  const halfA = await greedy(adapted, [{ id: 0, scale: 0.5 }]);
  const withB = await greedy(adapted, [{ id: 1, scale: 1 }]);
  assert.notEqual(halfA, withA);
  assert.notEqual(withB, withA);
  assert.notEqual(withB, base);
  // Unlisted adapters are at 0, and zero-scale entries change nothing.
  assert.equal(
    await greedy(adapted, [
      { id: 0, scale: 0 },
      { id: 1, scale: 1 },
    ]),
    withB,
  );
  // The prefix an adapter evaluated is never reused for the base (it has a context of its own).
  assert.equal(await greedy(adapted), base);
  assert.equal(adapted.adapterContexts, 1, "--lora-contexts 1: each new combination replaced the idle one");
  // And back to A after B replaced it: made again, same answer.
  assert.equal(await greedy(adapted, [{ id: 0, scale: 1 }]), withA);

  // Through the HTTP API, as the gateway sends it (llama-server's field).
  const answer = await client.completions.create({ model: "tiny", prompt: PROMPT, max_tokens: 8, temperature: 0, lora: [{ id: 0, scale: 1 }] } as never);
  assert.equal(answer.choices[0]?.text, withA);
  const chat = await client.chat.completions.create({
    model: "tiny",
    messages: [{ role: "user", content: "hello world" }],
    max_tokens: 8,
    temperature: 0,
    lora: [{ id: 1, scale: 1 }],
  } as never);
  const baseChat = await plain.chat([{ role: "user", content: "hello world" }], options());
  assert.notEqual(chat.choices[0]?.message.content, baseChat.text, "chat completions take lora too");
});

async function badRequest(
  body: Record<string, unknown>,
  runner: "adapted" | "plain" = "adapted",
): Promise<{ status: number; param: unknown; message: string }> {
  if (runner === "plain") server.setGenerator(plain);
  try {
    await client.completions.create({ model: "tiny", prompt: PROMPT, max_tokens: 2, temperature: 0, ...body } as never);
  } catch (error) {
    assert.ok(error instanceof APIError);
    const detail = error.error as { param?: unknown; message?: string };
    return { status: error.status ?? 0, param: detail.param, message: detail.message ?? "" };
  } finally {
    server.setGenerator(adapted);
  }
  assert.fail(`expected a 400 for ${JSON.stringify(body)}`);
}

test("unknown or repeated adapter ids, bad scales and lora on an engine without adapters are 400s naming the field", async () => {
  const cases: Array<[Record<string, unknown>, string, RegExp]> = [
    [{ lora: [{ id: 2, scale: 1 }] }, "lora.0.id", /no adapter 2; this engine serves 2 adapters \(ids 0 to 1\)/],
    [
      {
        lora: [
          { id: 1, scale: 1 },
          { id: 1, scale: 0.5 },
        ],
      },
      "lora.1.id",
      /adapter 1 is listed twice/,
    ],
    [{ lora: [{ id: -1, scale: 1 }] }, "lora.0.id", /./],
    [{ lora: [{ id: 0.5, scale: 1 }] }, "lora.0.id", /./],
    [{ lora: [{ id: 0, scale: 9 }] }, "lora.0.scale", /from -8 to 8/],
    [{ lora: [{ id: 0, scale: -9 }] }, "lora.0.scale", /from -8 to 8/],
    [{ lora: [{ id: 0 }] }, "lora.0.scale", /scale must be a number/],
    [{ lora: [{ id: 0, scale: "1" }] }, "lora.0.scale", /scale must be a number/],
    [{ lora: { id: 0, scale: 1 } }, "lora", /list of \{id, scale\}/],
  ];
  for (const [body, param, message] of cases) {
    const refused = await badRequest(body);
    assert.equal(refused.status, 400, JSON.stringify(body));
    assert.equal(refused.param, param, JSON.stringify(body));
    assert.match(refused.message, message, JSON.stringify(body));
  }
  const none = await badRequest({ lora: [{ id: 0, scale: 1 }] }, "plain");
  assert.equal(none.status, 400);
  assert.equal(none.param, "lora");
  assert.match(none.message, /started without --lora/);
  // The checks run before a sequence is taken: the engine still answers.
  assert.equal(await greedy(adapted), await greedy(plain));
});

test("past --lora-contexts while every adapter context is busy: a retryable 503; the busy one finishes its answer, and the base is unaffected", async () => {
  const base = await greedy(plain);
  let refusal: unknown;
  let refused: Promise<unknown> = Promise.resolve();
  const running = adapted.complete(PROMPT, {
    params: params([{ id: 0, scale: 1 }], 64),
    signal: new AbortController().signal,
    // The A context's one sequence is held from here until the generation ends, so B finds no idle context to replace.
    onStart: () => {
      refused = adapted.complete(PROMPT, options([{ id: 1, scale: 1 }])).then(
        () => assert.fail("a second combination must not get a context while the only one is busy"),
        (error: unknown) => {
          refusal = error;
        },
      );
    },
  });
  const held = await running;
  await refused;
  assert.ok(refusal instanceof UnavailableError, String(refusal));
  assert.equal(refusal.code, "adapter_contexts_busy");
  assert.equal(refusal.retryable, true);
  assert.match(refusal.message, /at most 1 adapter contexts \(--lora-contexts\)/);
  assert.equal(held.aborted, false);
  assert.ok(held.completionTokens > 0);
  assert.ok((await greedy(adapted, [{ id: 0, scale: 1 }])).length > 0);
  // The base has its own context, and B gets one once A is idle.
  assert.equal(await greedy(adapted), base);
  assert.notEqual(await greedy(adapted, [{ id: 1, scale: 1 }]), base);
});

test("an adapter llama.cpp refuses fails the load with its reason, naming the file among the adapters", async () => {
  // One case per process: once a failed load has disposed its Llama, node-llama-cpp (3.21.1)
  // no longer routes llama.cpp's log to the next one's logger, where the reason is read.
  // engine-command.test.ts starts engines with other refused adapters.
  const common = { modelPath, contextSize: 256, parallel: 1, threads: 1, logger: silentLogger() };
  await assert.rejects(LlamaRunner.load({ ...common, adapterPaths: [adapterA, modelPath, adapterB] }), (error: unknown) => {
    assert.ok(error instanceof AdapterLoadError, String(error));
    // A model is not an adapter.
    assert.equal(error.path, modelPath);
    assert.match(error.message, /^llama\.cpp could not load it as a LoRA adapter of this model: expect general\.type to be 'adapter'/);
    return true;
  });
});

test("the check of ids happens before anything runs, in the runner too", async () => {
  await assert.rejects(
    adapted.complete(PROMPT, options([{ id: 5, scale: 1 }])),
    (error: unknown) => error instanceof BadRequestError && error.param === "lora.0.id",
  );
  await assert.rejects(
    plain.chat([{ role: "user", content: "hi" }], options([{ id: 0, scale: 1 }])),
    (error: unknown) => error instanceof BadRequestError && error.param === "lora",
  );
});

test("llamaCppLaunch passes one --lora per adapter, in id order", () => {
  const profile = profileSchema.parse({ name: "cpu", engine: "llamacpp" });
  const launch = llamaCppLaunch({
    weightsPath: "/w/base.gguf",
    modelName: "m",
    profile,
    engineKey: "k",
    host: "127.0.0.1",
    port: 9000,
    adapters: ["/w/a.gguf", "/w/b.gguf"],
  });
  const args = launch.args;
  const loras = args.flatMap((arg, index) => (arg === "--lora" ? [args[index + 1]] : []));
  assert.deepEqual(loras, ["/w/a.gguf", "/w/b.gguf"]);
  const none = llamaCppLaunch({ weightsPath: "/w/base.gguf", modelName: "m", profile, engineKey: "k", host: "127.0.0.1", port: 9000 });
  assert.equal(none.args.includes("--lora"), false);
});

test("adapter contexts: one made per new combination however many ask at once, a failed one is a retryable 503 and made again next time, an idle one replaced", async () => {
  const made: string[] = [];
  const disposed: string[] = [];
  let failNext = true;
  // Stand-in lanes: the bookkeeping is under test here, the contexts above.
  const fakeLane = (key: string): Lane =>
    ({
      key,
      context: { dispose: async () => void disposed.push(key) },
      pool: new SequencePool([]),
      lockstep: new DecodeLockstep(),
    }) as unknown as Lane;
  const lanes = new AdapterLanes({
    base: fakeLane(""),
    shape: {} as LaneShape,
    adapterPaths: ["/a.gguf", "/b.gguf"],
    maxAdapterLanes: 1,
    logger: silentLogger(),
    create: async (_shape, key) => {
      made.push(key);
      if (failNext) {
        failNext = false;
        throw new Error("not enough memory for the KV cache");
      }
      return fakeLane(key);
    },
  });
  const a = lanes.choose([{ id: 0, scale: 1 }]);
  await assert.rejects(lanes.acquire(a), (error: unknown) => {
    assert.ok(error instanceof UnavailableError);
    assert.equal(error.code, "adapter_context_failed");
    assert.match(error.message, /adapters 0:1 \(not enough memory for the KV cache\)/);
    return true;
  });
  assert.equal(lanes.adapterLaneCount, 0, "a failed context is not kept");
  const [first, second] = await Promise.all([lanes.acquire(a), lanes.acquire(a)]);
  assert.equal(first, second);
  assert.deepEqual(made, ["0:1", "0:1"], "made once for both requests, after the failed try");
  lanes.release(first);
  lanes.release(second);
  const b = await lanes.acquire(
    lanes.choose([
      { id: 1, scale: 0.5 },
      { id: 0, scale: 0 },
    ]),
  );
  assert.equal(b.key, "1:0.5");
  assert.deepEqual(disposed, ["0:1"], "the idle context was disposed before the new one was made");
  assert.equal(lanes.adapterLaneCount, 1);
  assert.equal(await lanes.acquire(lanes.choose([])), lanes.base);
  lanes.release(b);
});

test("two lanes decoding at the same time take turns at full width: each decodes with all of --threads", async () => {
  const threads = 2;
  const { llama, model } = await openModel({ modelPath, threads, logger: silentLogger() });
  try {
    const shape: LaneShape = { model, contextSize: 256, sequences: 1, threads, batchMeter: new DecodeBatchMeter() };
    const base = await createLane(shape, "", [{ filePath: adapterA, scale: 0 }]);
    const lane = await createLane(shape, "0:1", [{ filePath: adapterA, scale: 1 }]);
    // Both queue a decode in the same tick. node-llama-cpp's thread splitter divides a
    // plain number of threads between the contexts decoding at the moment, so each would
    // get one, and with the engine's one libuv thread they would still run one after the
    // other, each at half width.
    const decode = async ({ pool }: Lane) => {
      const sequence = await pool.acquire(new AbortController().signal);
      await sequence.evaluateWithoutGeneratingNewTokens(PROMPT as Token[]);
      pool.release(sequence);
    };
    await Promise.all([decode(base), decode(lane)]);
    assert.equal(base.context.currentThreads, threads, "the base lane");
    assert.equal(lane.context.currentThreads, threads, "the adapter lane");
    await lane.context.dispose();
    await base.context.dispose();
  } finally {
    await model.dispose();
    await llama.dispose();
  }
});
