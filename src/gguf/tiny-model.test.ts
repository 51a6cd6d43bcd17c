import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, readFile, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { GGUFValueType, gguf } from "@huggingface/gguf";
import { ChatMLChatWrapper, LlamaCompletion, getLlama, resolveChatWrapper, type Llama, type Token } from "node-llama-cpp";
import { TINY_CHAT_TEMPLATE, writeTinyLlamaGguf } from "./tiny-model.ts";

let dir: string;
let llama: Llama;

before(async () => {
  dir = await mkdtemp(join(tmpdir(), "llmgw-tiny-"));
  // One thread: llama.cpp's default of max(cores, 4) threads is far slower than one on a
  // model this small, because of thread synchronisation.
  llama = await getLlama({ gpu: false, build: "never", skipDownload: true, usePrebuiltBinaries: true, progressLogs: false, maxThreads: 1 });
});

after(async () => {
  await llama?.dispose();
  await rm(dir, { recursive: true, force: true });
});

test("the bundled llama.cpp loads the tiny model and generates tokens", async () => {
  const info = await writeTinyLlamaGguf({ path: join(dir, "tiny.gguf"), seed: 7 });
  assert.ok(info.bytes < 5 * 1024 * 1024, `default model is ${info.bytes} bytes`);
  assert.equal((await stat(info.path)).size, info.bytes);

  const model = await llama.loadModel({ modelPath: info.path });
  try {
    assert.equal(model.tokens.bos, info.tokens.bos);
    // `<|im_end|>` ends generation, so a ChatML reply can finish.
    assert.equal(model.tokens.eos, info.tokens.imEnd);
    assert.ok(model.isEogToken(info.tokens.imEnd as Token));
    // Ordinary words are single tokens; anything else falls back to bytes and round-trips.
    assert.deepEqual(model.detokenize(model.tokenize("hello world")), "hello world");
    assert.ok(model.tokenize("hello world").length <= 3, "words of the vocabulary tokenise as whole pieces");
    const odd = "naïve ✓ 日本";
    assert.equal(model.detokenize(model.tokenize(odd)), odd);
    assert.ok(resolveChatWrapper(model) instanceof ChatMLChatWrapper, "the ChatML chat_template resolves to node-llama-cpp's ChatML wrapper");

    const context = await model.createContext({ contextSize: 256 });
    try {
      const completion = new LlamaCompletion({ contextSequence: context.getSequence() });
      let generated = 0;
      const result = await completion.generateCompletionWithMeta("hello", {
        maxTokens: 8,
        temperature: 0,
        onToken: (tokens) => {
          generated += tokens.length;
        },
      });
      assert.ok(generated > 0, "it generated tokens");
      assert.ok(["maxTokens", "eogToken"].includes(result.metadata.stopReason));
    } finally {
      await context.dispose();
    }
  } finally {
    await model.dispose();
  }
});

test("@huggingface/gguf reads back the metadata with the types llama.cpp requires", async () => {
  const info = await writeTinyLlamaGguf({
    path: join(dir, "meta.gguf"),
    seed: 3,
    embeddingLength: 32,
    layers: 1,
    heads: 4,
    kvHeads: 2,
    feedForwardLength: 48,
    contextLength: 2048,
    name: "stand-in",
    extraMetadata: {
      "general.file_type": { value: 15, type: GGUFValueType.UINT32 },
      "split.no": { value: 0, type: GGUFValueType.UINT16 },
      "split.count": { value: 3, type: GGUFValueType.UINT16 },
    },
  });
  const parsed = await gguf(info.path, { allowLocalFile: true, typedMetadata: true, computeParametersCount: true });
  const typed = parsed.typedMetadata as Record<string, { value: unknown; type: GGUFValueType; subType?: GGUFValueType }>;
  const entry = (key: string) => {
    const value = typed[key];
    assert.ok(value, `key ${key} is present`);
    return value;
  };

  assert.equal(entry("version").value, 3);
  assert.deepEqual(entry("general.architecture"), { value: "llama", type: GGUFValueType.STRING });
  assert.equal(entry("general.name").value, "stand-in");
  assert.deepEqual(entry("general.alignment"), { value: 32, type: GGUFValueType.UINT32 });
  for (const [key, value] of [
    ["llama.context_length", 2048],
    ["llama.embedding_length", 32],
    ["llama.block_count", 1],
    ["llama.feed_forward_length", 48],
    ["llama.attention.head_count", 4],
    ["llama.attention.head_count_kv", 2],
    ["llama.rope.dimension_count", 8],
  ] as const) {
    assert.deepEqual(entry(key), { value, type: GGUFValueType.UINT32 }, key);
  }
  assert.equal(entry("llama.attention.layer_norm_rms_epsilon").type, GGUFValueType.FLOAT32);
  assert.equal(entry("tokenizer.ggml.model").value, "llama");
  assert.equal(entry("tokenizer.chat_template").value, TINY_CHAT_TEMPLATE);
  assert.deepEqual(entry("general.file_type"), { value: 15, type: GGUFValueType.UINT32 }, "extraMetadata overrides a generated key");
  assert.deepEqual(entry("split.count"), { value: 3, type: GGUFValueType.UINT16 });

  const tokens = entry("tokenizer.ggml.tokens");
  assert.equal(tokens.subType, GGUFValueType.STRING);
  const list = tokens.value as string[];
  assert.equal(list.length, info.vocabSize);
  assert.equal(new Set(list).size, list.length, "token strings are unique");
  const types = entry("tokenizer.ggml.token_type").value as number[];
  for (let byte = 0; byte < 256; byte++) {
    const text = `<0x${byte.toString(16).toUpperCase().padStart(2, "0")}>`;
    const id = list.indexOf(text);
    assert.ok(id >= 0 && types[id] === 6, `${text} is a byte token`);
  }
  assert.equal(types[list.indexOf("<|im_start|>")], 3);
  assert.equal(types[list.indexOf("<|im_end|>")], 3);
  assert.equal(entry("tokenizer.ggml.eos_token_id").value, list.indexOf("<|im_end|>"));

  // Tensor layout: the llama tensors only, F32, offsets the running sum of padded sizes.
  assert.equal(parsed.tensorInfos.length, info.tensorCount);
  assert.equal(parsed.tensorInfos.length, 3 + 9 * 1);
  let expected = 0n;
  for (const tensor of parsed.tensorInfos) {
    assert.equal(tensor.offset, expected, `offset of ${tensor.name}`);
    assert.equal(tensor.dtype, 0);
    const bytes = tensor.shape.reduce((a, b) => a * b, 1n) * 4n;
    expected += ((bytes + 31n) / 32n) * 32n;
  }
  assert.equal(Number(parsed.tensorDataOffset % 32n), 0);
  assert.equal(BigInt(info.bytes), parsed.tensorDataOffset + expected);
  assert.equal(parsed.parameterCount, info.parameterCount);
  assert.deepEqual(parsed.tensorInfos.find((t) => t.name === "blk.0.attn_k.weight")?.shape, [32n, 16n], "K projection is n_embd × (kv heads × head dim)");
});

test("the same seed gives the same bytes, another seed other weights", async () => {
  const a = await writeTinyLlamaGguf({ path: join(dir, "a.gguf"), seed: 11 });
  const b = await writeTinyLlamaGguf({ path: join(dir, "b.gguf"), seed: 11 });
  const c = await writeTinyLlamaGguf({ path: join(dir, "c.gguf"), seed: 12 });
  const [bytesA, bytesB, bytesC] = await Promise.all([readFile(a.path), readFile(b.path), readFile(c.path)]);
  assert.ok(bytesA.equals(bytesB));
  assert.equal(bytesA.length, bytesC.length);
  assert.ok(!bytesA.equals(bytesC));
});

test("an endless model cannot pick an end token: its output rows for control tokens are zero", async () => {
  const info = await writeTinyLlamaGguf({ path: join(dir, "endless.gguf"), seed: 11, endless: true });
  const plain = await readFile((await writeTinyLlamaGguf({ path: join(dir, "not-endless.gguf"), seed: 11 })).path);
  const endless = await readFile(info.path);
  const parsed = await gguf(info.path, { allowLocalFile: true });
  const output = parsed.tensorInfos.find((t) => t.name === "output.weight");
  assert.ok(output);
  const embd = Number(output.shape[0]);
  const row = (bytes: Buffer, token: number) => {
    const start = Number(parsed.tensorDataOffset + output.offset) + token * embd * 4;
    return new Float32Array(bytes.buffer.slice(bytes.byteOffset + start, bytes.byteOffset + start + embd * 4));
  };
  for (const token of [info.tokens.imEnd, info.tokens.eos, info.tokens.bos, info.tokens.unk]) {
    assert.ok(
      row(endless, token).every((v) => v === 0),
      `row ${token} is zero`,
    );
  }
  // Same seed otherwise: ordinary rows are the plain model's.
  assert.deepEqual(row(endless, info.tokens.imEnd + 1), row(plain, info.tokens.imEnd + 1));
  assert.ok(row(plain, info.tokens.imEnd).some((v) => v !== 0));
});

test("shapes that llama.cpp cannot load are refused before writing", async () => {
  await assert.rejects(writeTinyLlamaGguf({ path: join(dir, "bad.gguf"), embeddingLength: 30, heads: 4 }), /multiple of heads/);
  await assert.rejects(writeTinyLlamaGguf({ path: join(dir, "bad.gguf"), heads: 4, kvHeads: 3 }), /multiple of kvHeads/);
});

test("a textOnly model writes only printable text, sampled hot, whatever the prompt; the plain model does not", async () => {
  /** The ids of every token sampled over a few prompts at temperature 1.5. */
  const sampledTokens = async (path: string) => {
    const model = await llama.loadModel({ modelPath: path });
    const context = await model.createContext({ contextSize: 512 });
    const seen: number[] = [];
    try {
      for (const [index, prompt] of ["hello", "naïve ✓ 日本", "<|im_start|>user\nsay one sentence"].entries()) {
        const sequence = context.getSequence();
        try {
          await new LlamaCompletion({ contextSequence: sequence }).generateCompletion(prompt, {
            maxTokens: 120,
            temperature: 1.5,
            seed: index + 1,
            customStopTriggers: [],
            onToken: (tokens) => seen.push(...tokens),
          });
        } finally {
          await sequence.dispose();
        }
      }
    } finally {
      await context.dispose();
      await model.dispose();
    }
    return seen;
  };
  // Byte tokens are ids 3..258 (<0x00>..<0xFF>): printable ASCII is 0x20..0x7E, plus tab and newline.
  const unprintable = (id: number) => id >= 3 && id <= 258 && !(id - 3 === 0x09 || id - 3 === 0x0a || (id - 3 >= 0x20 && id - 3 < 0x7f));
  const text = await writeTinyLlamaGguf({ path: join(dir, "text.gguf"), seed: 7, textOnly: true });
  const textTokens = await sampledTokens(text.path);
  assert.ok(textTokens.length > 100, `sampled ${textTokens.length} tokens`);
  assert.deepEqual(textTokens.filter(unprintable), [], "no unprintable byte token");
  assert.deepEqual(
    textTokens.filter((id) => id < 3 || id === text.tokens.imStart),
    [],
    "no control token but <|im_end|>",
  );
  // The same sampling on the plain model does pick such bytes: the test can tell the two apart.
  const plain = await writeTinyLlamaGguf({ path: join(dir, "plain.gguf"), seed: 7 });
  assert.ok((await sampledTokens(plain.path)).some(unprintable), "the plain random model emits unprintable bytes");
});
