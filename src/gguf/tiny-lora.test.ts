import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, readFile, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { GGUFValueType, gguf } from "@huggingface/gguf";
import { LlamaCompletion, LlamaLogLevel, getLlama, type Llama, type LlamaModel } from "node-llama-cpp";
import { writeTinyLlamaGguf } from "./tiny-model.ts";
import { writeTinyLora } from "./tiny-lora.ts";

let dir: string;
let llama: Llama;
// llama.cpp explains a refused adapter only in its log; node-llama-cpp's error names the file.
const llamaErrors: string[] = [];

before(async () => {
  dir = await mkdtemp(join(tmpdir(), "llmgw-tiny-lora-"));
  llama = await getLlama({
    gpu: false,
    build: "never",
    skipDownload: true,
    usePrebuiltBinaries: true,
    progressLogs: false,
    // One thread: far faster than several on a model this small (see tiny-model.test.ts).
    maxThreads: 1,
    logLevel: LlamaLogLevel.warn,
    logger: (level, message) => {
      if (level === LlamaLogLevel.error) llamaErrors.push(message.trim());
    },
  });
});

after(async () => {
  await llama?.dispose();
  await rm(dir, { recursive: true, force: true });
});

/**
 * Token ids generated for a prompt, with the adapter at `scale` when one is given: greedy
 * (8 tokens) unless `sample` says otherwise. No repeat penalty and no stop triggers:
 * node-llama-cpp applies them by default, llama-server does not.
 */
async function generate(
  model: LlamaModel,
  prompt: string,
  lora?: { path: string; scale: number },
  sample: { maxTokens: number; temperature: number; seed: number } = { maxTokens: 8, temperature: 0, seed: 0 },
): Promise<number[]> {
  const context = await model.createContext({
    contextSize: 256,
    ...(lora ? { lora: { adapters: [{ filePath: lora.path, scale: lora.scale }] } } : {}),
  });
  try {
    const completion = new LlamaCompletion({ contextSequence: context.getSequence() });
    const tokens: number[] = [];
    await completion.generateCompletion(prompt, { ...sample, repeatPenalty: false, customStopTriggers: [], onToken: (chunk) => tokens.push(...chunk) });
    return tokens;
  } finally {
    await context.dispose();
  }
}

test("the adapter file has llama.cpp's keys, key types and tensor shapes", async () => {
  const shape = { embeddingLength: 32, layers: 1, heads: 4, kvHeads: 2, feedForwardLength: 48 };
  const model = await writeTinyLlamaGguf({ path: join(dir, "shape-model.gguf"), ...shape });
  const options = { ...shape, vocabSize: model.vocabSize, rank: 3, alpha: 6, targets: ["attn_q", "attn_v", "ffn_down", "output"] } as const;
  const info = await writeTinyLora({ path: join(dir, "shape.gguf"), ...options });
  assert.equal((await stat(info.path)).size, info.bytes);
  assert.deepEqual(info.adapted, ["blk.0.attn_q.weight", "blk.0.attn_v.weight", "blk.0.ffn_down.weight", "output.weight"]);

  const parsed = await gguf(info.path, { allowLocalFile: true, typedMetadata: true });
  const typed = parsed.typedMetadata as unknown as Record<string, { value: unknown; type: GGUFValueType } | undefined>;
  assert.deepEqual(typed["general.type"], { value: "adapter", type: GGUFValueType.STRING });
  assert.deepEqual(typed["adapter.type"], { value: "lora", type: GGUFValueType.STRING });
  assert.deepEqual(typed["adapter.lora.alpha"], { value: 6, type: GGUFValueType.FLOAT32 }, "llama.cpp reads alpha as FLOAT32 only");
  assert.deepEqual(typed["general.architecture"], { value: "llama", type: GGUFValueType.STRING });
  assert.equal(typed["llama.embedding_length"], undefined, "like converted adapters, it carries no model hparams");

  // lora_a is [in, rank] and lora_b [rank, out] in ggml order, for base weights [in, out].
  const shapes = Object.fromEntries(parsed.tensorInfos.map((t) => [t.name, t.shape.map(Number)]));
  assert.deepEqual(shapes, {
    "blk.0.attn_q.weight.lora_a": [32, 3],
    "blk.0.attn_q.weight.lora_b": [3, 32],
    "blk.0.attn_v.weight.lora_a": [32, 3],
    "blk.0.attn_v.weight.lora_b": [3, 16],
    "blk.0.ffn_down.weight.lora_a": [48, 3],
    "blk.0.ffn_down.weight.lora_b": [3, 32],
    "output.weight.lora_a": [32, 3],
    "output.weight.lora_b": [3, model.vocabSize],
  });
  let expected = 0n;
  for (const tensor of parsed.tensorInfos) {
    assert.equal(tensor.offset, expected, `offset of ${tensor.name}`);
    assert.equal(tensor.dtype, 0, "F32");
    expected += ((tensor.shape.reduce((a, b) => a * b, 1n) * 4n + 31n) / 32n) * 32n;
  }
  assert.equal(Number(parsed.tensorDataOffset % 32n), 0);

  const again = await writeTinyLora({ path: join(dir, "shape-again.gguf"), ...options });
  assert.ok((await readFile(info.path)).equals(await readFile(again.path)), "the same seed and options give the same bytes");
  await assert.rejects(writeTinyLora({ path: join(dir, "no-vocab.gguf"), targets: ["output"] }), /needs vocabSize/);
});

test("the bundled llama.cpp applies the adapter: greedy tokens differ from the base's, and scale 0 gives the base's", async () => {
  const base = await writeTinyLlamaGguf({ path: join(dir, "base.gguf"), seed: 5 });
  const adapter = await writeTinyLora({ path: join(dir, "adapter.gguf"), seed: 105 });
  const model = await llama.loadModel({ modelPath: base.path });
  try {
    const plain = await generate(model, "hello world");
    const adapted = await generate(model, "hello world", { path: adapter.path, scale: 1 });
    const off = await generate(model, "hello world", { path: adapter.path, scale: 0 });
    assert.ok(plain.length > 0 && adapted.length > 0, `both generate (base ${plain.length} tokens, adapted ${adapted.length})`);
    assert.notDeepEqual(adapted, plain, "the adapter changes the greedy tokens");
    assert.ok(
      adapted.every((id) => id >= 0 && id < base.vocabSize),
      "the adapted model's tokens are real tokens (finite logits)",
    );
    assert.deepEqual(off, plain, "at scale 0 the adapter changes nothing, so the difference is the adapter's");
  } finally {
    await model.dispose();
  }
});

test("the bundled llama.cpp refuses an adapter made for another embedding size or architecture", async () => {
  const base = await writeTinyLlamaGguf({ path: join(dir, "refusing-base.gguf"), seed: 2 });
  const model = await llama.loadModel({ modelPath: base.path });
  try {
    const cases = [
      { file: "wide.gguf", options: { embeddingLength: 128 }, says: /tensor 'blk\.0\.attn_q\.weight' has incorrect shape \(hint: maybe wrong base model\?\)/ },
      { file: "qwen2.gguf", options: { architecture: "qwen2" }, says: /model arch and LoRA arch mismatch/ },
    ];
    for (const { file, options, says } of cases) {
      const adapter = await writeTinyLora({ path: join(dir, file), ...options });
      llamaErrors.length = 0;
      // node-llama-cpp's error names only the file; llama.cpp's log says why, naming neither value.
      await assert.rejects(model.createContext({ contextSize: 256, lora: { adapters: [{ filePath: adapter.path }] } }), /Failed to initialize LoRA adapter/);
      assert.ok(
        llamaErrors.some((line) => says.test(line)),
        `llama.cpp logged why: ${JSON.stringify(llamaErrors)}`,
      );
    }
    // The model stays usable after a refused adapter.
    assert.ok((await generate(model, "hello")).length > 0);
  } finally {
    await model.dispose();
  }
});

test("an adapter on a textOnly base keeps the reply printable text, sampled hot, while changing it", async () => {
  // What llama-server tests rely on (see tiny-lora.ts's header): its chat parser refuses a
  // reply that is not valid UTF-8, and a textOnly base never writes one.
  const base = await writeTinyLlamaGguf({ path: join(dir, "text-base.gguf"), seed: 5, textOnly: true });
  const adapter = await writeTinyLora({ path: join(dir, "text-adapter.gguf"), seed: 105 });
  const strong = await writeTinyLora({ path: join(dir, "text-strong.gguf"), seed: 105, strength: 8 });
  // Byte tokens are ids 3..258 (<0x00>..<0xFF>): printable ASCII is 0x20..0x7E, plus tab and newline.
  const banned = (id: number) =>
    id < 3 || id === base.tokens.imStart || (id <= 258 && !(id - 3 === 0x09 || id - 3 === 0x0a || (id - 3 >= 0x20 && id - 3 < 0x7f)));
  const model = await llama.loadModel({ modelPath: base.path });
  try {
    /** Every token sampled at temperature 1.5 over a few prompts, with the adapter at this scale. */
    const sampled = async (path: string, scale: number) => {
      const tokens: number[] = [];
      for (const [index, prompt] of ["hello", "naïve ✓ 日本", "<|im_start|>user\nsay one sentence", "the tiny model"].entries()) {
        tokens.push(...(await generate(model, prompt, { path, scale }, { maxTokens: 120, temperature: 1.5, seed: index + 1 })));
      }
      return tokens;
    };
    const adapted = await sampled(adapter.path, 1);
    assert.ok(adapted.length > 100, `sampled ${adapted.length} tokens`);
    assert.deepEqual(adapted.filter(banned), [], "no unprintable byte token, no control token but <|im_end|>");
    assert.notDeepEqual(adapted, await sampled(adapter.path, 0), "the adapter changes the reply");
    assert.deepEqual((await sampled(adapter.path, 4)).filter(banned), [], "nor at four times the scale");
    // An adapter 32 times as strong grows the residual stream enough to wash out the ban: the check can tell.
    assert.ok((await sampled(strong.path, 8)).some(banned), "a far stronger adapter does break the ban");
  } finally {
    await model.dispose();
  }
});
