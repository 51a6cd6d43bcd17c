import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, readFile, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { GGUFValueType, gguf } from "@huggingface/gguf";
import { readGgufHeader } from "./header.ts";
import { TINY_PROJECTOR_TYPE, writeTinyProjector } from "./tiny-projector.ts";

let dir: string;

before(async () => {
  dir = await mkdtemp(join(tmpdir(), "llmgw-tiny-projector-"));
});

after(async () => {
  await rm(dir, { recursive: true, force: true });
});

type Typed = Record<string, { value: unknown; type: GGUFValueType; subType?: GGUFValueType }>;

test("the projector has the keys llama.cpp's clip loader requires, with the types it asserts", async () => {
  const info = await writeTinyProjector({ path: join(dir, "keys.gguf"), textEmbeddingLength: 64 });
  const parsed = await gguf(info.path, { allowLocalFile: true, typedMetadata: true });
  const typed = parsed.typedMetadata as unknown as Typed;
  const entry = (key: string) => {
    const value = typed[key];
    assert.ok(value, `key ${key} is present`);
    return value;
  };
  assert.equal(entry("version").value, 3);
  assert.deepEqual(entry("general.architecture"), { value: "clip", type: GGUFValueType.STRING });
  assert.deepEqual(entry("general.alignment"), { value: 32, type: GGUFValueType.UINT32 });
  assert.deepEqual(entry("clip.has_vision_encoder"), { value: true, type: GGUFValueType.BOOL });
  assert.deepEqual(entry("clip.projector_type"), { value: "mlp", type: GGUFValueType.STRING });
  assert.equal(TINY_PROJECTOR_TYPE, "mlp");
  for (const [key, value] of [
    ["clip.vision.image_size", 32],
    ["clip.vision.patch_size", 16],
    ["clip.vision.embedding_length", 32],
    ["clip.vision.feed_forward_length", 64],
    ["clip.vision.block_count", 2],
    ["clip.vision.attention.head_count", 2],
    ["clip.vision.projection_dim", 64],
  ] as const) {
    assert.deepEqual(entry(key), { value, type: GGUFValueType.UINT32 }, key);
  }
  assert.equal(entry("clip.vision.attention.layer_norm_epsilon").type, GGUFValueType.FLOAT32);
  for (const key of ["clip.vision.image_mean", "clip.vision.image_std"]) {
    const array = entry(key);
    assert.equal(array.type, GGUFValueType.ARRAY, key);
    assert.equal(array.subType, GGUFValueType.FLOAT32, `${key} holds FLOAT32 (llama.cpp refuses other element types)`);
    assert.deepEqual(array.value, [0.5, 0.5, 0.5], key);
  }
});

test("the projector's tensors have the names and ggml shapes of a LLaVA mlp projector, and the project's header reader accepts the layout", async () => {
  const info = await writeTinyProjector({ path: join(dir, "tensors.gguf"), textEmbeddingLength: 64, seed: 3 });
  // E = 32 (vision width), P = 16 (patch), N = (32 / 16)² = 4 patches, F = 64, T = 64 (text width).
  const expected: Record<string, number[]> = {
    "v.patch_embd.weight": [16, 16, 3, 32],
    "v.position_embd.weight": [32, 4],
    "mm.0.weight": [32, 64],
    "mm.0.bias": [64],
    "mm.2.weight": [64, 64],
    "mm.2.bias": [64],
  };
  for (const layer of [0, 1]) {
    for (const part of ["attn_q", "attn_k", "attn_v", "attn_out"]) expected[`v.blk.${layer}.${part}.weight`] = [32, 32];
    expected[`v.blk.${layer}.ffn_up.weight`] = [32, 64];
    expected[`v.blk.${layer}.ffn_down.weight`] = [64, 32];
  }

  const parsed = await gguf(info.path, { allowLocalFile: true });
  const shapes = Object.fromEntries(parsed.tensorInfos.map((tensor) => [tensor.name, tensor.shape.map(Number)]));
  assert.deepEqual(shapes, expected);
  assert.ok(
    parsed.tensorInfos.every((tensor) => tensor.dtype === 0),
    "every tensor is F32",
  );
  assert.deepEqual(info.tensorNames, Object.keys(shapes));
  assert.equal(info.imageTokens, 4);

  const summary = await readGgufHeader({ file: info.path });
  assert.equal(summary.architecture, "clip");
  assert.equal(summary.tensorCount, Object.keys(expected).length);
  assert.equal(summary.tensorCount, info.tensorCount);
  const parameters = Object.values(expected).reduce((sum, dims) => sum + dims.reduce((a, b) => a * b, 1), 0);
  assert.equal(summary.parameterCount, parameters);
  assert.equal(info.parameterCount, parameters);
  assert.equal(summary.quantisation, "F32");
  assert.equal(summary.fileBytes, info.bytes);
  assert.equal((await stat(info.path)).size, info.bytes);
  assert.ok(info.bytes < 200 * 1024, `the default projector is tiny (${info.bytes} bytes)`);
});

test("the output width follows the text model and the patch grid follows the image and patch sizes", async () => {
  const info = await writeTinyProjector({ path: join(dir, "wide.gguf"), textEmbeddingLength: 48, imageSize: 28, patchSize: 14, layers: 1 });
  const parsed = await gguf(info.path, { allowLocalFile: true });
  const shape = (name: string) => parsed.tensorInfos.find((tensor) => tensor.name === name)?.shape.map(Number);
  // llama.cpp takes the projector's width from mm.2.weight ne[1] and checks it against the text model's n_embd.
  assert.deepEqual(shape("mm.2.weight"), [48, 48]);
  assert.deepEqual(shape("v.patch_embd.weight"), [14, 14, 3, 32]);
  assert.deepEqual(shape("v.position_embd.weight"), [32, 4]);
  assert.equal(shape("v.blk.1.attn_out.weight"), undefined, "one layer asked, one layer written");
  assert.equal(info.imageTokens, 4);
});

test("one seed gives the same bytes; another seed gives other weights", async () => {
  const a = await writeTinyProjector({ path: join(dir, "a.gguf"), textEmbeddingLength: 64, seed: 5 });
  const b = await writeTinyProjector({ path: join(dir, "b.gguf"), textEmbeddingLength: 64, seed: 5 });
  const c = await writeTinyProjector({ path: join(dir, "c.gguf"), textEmbeddingLength: 64, seed: 6 });
  const [bytesA, bytesB, bytesC] = await Promise.all([readFile(a.path), readFile(b.path), readFile(c.path)]);
  assert.ok(bytesA.equals(bytesB));
  assert.equal(bytesA.length, bytesC.length);
  assert.ok(!bytesA.equals(bytesC));
});

test("shapes llama.cpp would refuse or misread are refused with the values involved", async () => {
  const path = join(dir, "bad.gguf");
  await assert.rejects(writeTinyProjector({ path, textEmbeddingLength: 64, imageSize: 30, patchSize: 16 }), /patchSize 16 does not divide imageSize 30/);
  await assert.rejects(writeTinyProjector({ path, textEmbeddingLength: 64, embeddingLength: 32, feedForwardLength: 32 }), /feedForwardLength must differ/);
  await assert.rejects(writeTinyProjector({ path, textEmbeddingLength: 64, embeddingLength: 30, heads: 4 }), /not a multiple of heads 4/);
  await assert.rejects(writeTinyProjector({ path, textEmbeddingLength: 0 }), /textEmbeddingLength must be a positive integer, got 0/);
});
