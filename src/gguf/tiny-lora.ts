// Generator of tiny LoRA adapter GGUF files for the tiny llama models of tiny-model.ts, so
// tests of adapters (loading, serving under their own model name, refusing one made for
// another base) never download anything. The weights are random from a seeded PRNG and
// scaled so that the adapter clearly changes what the model generates.
//
// The format is what llama.cpp's loader reads (src/llama-adapter.cpp,
// llama_adapter_lora_init_impl, at commit 80fb11ac, the source node-llama-cpp bundles):
// - `general.type` must be the string "adapter" and `adapter.type` the string "lora",
//   otherwise it throws "expect general.type to be 'adapter'" / "expect adapter.type to
//   be 'lora'". The strings are read with gguf_get_val_str, which asserts the type, so a
//   non-string value aborts the process rather than failing the load.
// - `general.architecture` must name the base model's architecture ("model arch and LoRA
//   arch mismatch").
// - `adapter.lora.alpha` is read with gguf_get_val_f32, so it must be FLOAT32 (another type
//   aborts). Absent, it counts as 0, and then the adapter's product is scaled by the user's
//   scale alone; otherwise by scale × alpha / rank, with rank = lora_b's ne[0]
//   (llama_adapter_lora_weight::get_scale in src/llama-adapter.h).
// - Tensors are named `<base tensor name>.lora_a` and `.lora_b`; any other name except one
//   ending in `_norm.weight` (skipped) fails the load ("has unexpected suffix"), and each
//   pair needs both halves. The base tensor must exist in the model.
// - Shapes, in ggml order (ne[0] contiguous): for a base weight W of [in, out], lora_a is
//   [in, rank] and lora_b is [rank, out]; the loader checks W.ne[0] == a.ne[0],
//   W.ne[1] == b.ne[1] and a.ne[1] == b.ne[0] ("has incorrect shape (hint: maybe wrong base
//   model?)"). token_embd is the exception (a and b flipped), which this generator does
//   not produce.
// - Tensor types are not checked: the pair is used as mul_mat(b, mul_mat(a, x))
//   (llm_graph_context::build_lora_mm in src/llama-graph.cpp), so any type ggml multiplies
//   works; convert_lora_to_gguf.py writes f32, f16, bf16 or q8_0. This generator writes F32.
// - Which matrices an adapter can reach on a llama model: build_lora_mm wraps attn_q,
//   attn_k, attn_v, attn_output, the three ffn weights and output (src/models/llama.cpp).
// The file layout (GGUF v3, alignment 32, offsets) is ./gguf-writer.ts's.
//
// Adapters for tests against the real llama-server go on a `textOnly` base (tiny-model.ts).
// At commit 80fb11ac llama-server parses every completion's text and answers 500 ("does not
// match the expected ... format") when it is not valid UTF-8, which a random model's stray
// byte tokens produce. A textOnly base bans those tokens through embedding axis 0, which no
// layer writes. An adapter on the matrices that read the residual stream (attn_q/k/v,
// ffn_gate/up; the default targets are among them) cannot write it either, because what
// they change reaches the stream only through attn_output and ffn_down, whose row 0 the
// base zeroes; adapting attn_output, ffn_down or output can undo the ban. What such an
// adapter can do is grow the residual stream, which shrinks axis 0 after the final RMS
// norm and with it the ban: sampled at temperature 1.5, the ban held at the default
// strength up to scale 4 (five base seeds), and failed at 16 times the default.
import { GGUFValueType, GGUF_ALIGNMENT, createPrng, fillUniform, writeGguf, type TypedMetadataValue } from "./gguf-writer.ts";
import type { TinyLlamaOptions } from "./tiny-model.ts";

/** The base matrices of a llama model that llama.cpp applies a LoRA pair to. */
export type TinyLoraTarget = "attn_q" | "attn_k" | "attn_v" | "attn_output" | "ffn_gate" | "ffn_up" | "ffn_down" | "output";

/**
 * PEFT's default for llama (q_proj and v_proj). With the default strength they change the
 * first greedy token of the tiny model on every seed tried (1 to 11, prompt "hello world"),
 * so `output`, which needs the vocabulary size, is not among them.
 */
export const DEFAULT_LORA_TARGETS: readonly TinyLoraTarget[] = ["attn_q", "attn_v"];

/** The base model's shape fields, as given to writeTinyLlamaGguf, with its defaults. */
type TinyLlamaShape = Pick<TinyLlamaOptions, "embeddingLength" | "layers" | "heads" | "kvHeads" | "feedForwardLength">;

export interface TinyLoraOptions extends TinyLlamaShape {
  /** Where to write the file (overwritten if present). */
  path: string;
  /** Seed of the weight PRNG; the same seed and options give the same bytes. Default 1. */
  seed?: number;
  /** The base model's vocabulary size (TinyLlamaInfo.vocabSize); needed only to adapt `output`. */
  vocabSize?: number;
  /** LoRA rank r. Default 4. */
  rank?: number;
  /** `adapter.lora.alpha`; llama.cpp scales the pair's product by alpha / rank. Default 2 × rank. */
  alpha?: number;
  /** The matrices to adapt, in every layer (`output` once). Default attn_q and attn_v. */
  targets?: readonly TinyLoraTarget[];
  /**
   * How strongly the adapter changes the model: each adapted weight gains a delta
   * ((alpha / rank) · B·A) whose elements have a standard deviation of strength / √in, so the
   * delta alone maps a unit-variance input to outputs of standard deviation `strength`
   * (the tiny model's own projections map to about 1, its output projection to about 4).
   * Default 2: greedy decoding with the adapter then differs from the base's within a few
   * tokens, the values stay small enough to be finite in F32, and a textOnly base still
   * writes only text (see the header).
   */
  strength?: number;
  /** `general.architecture`. Default "llama"; another value makes an adapter for another base. */
  architecture?: string;
  /** `general.name`. Default "llmgw tiny lora". */
  name?: string;
  /** More typed key/values, added to (or replacing) the generated ones, for bad-input tests. */
  extraMetadata?: Record<string, TypedMetadataValue>;
}

export interface TinyLoraInfo {
  path: string;
  /** File size in bytes. */
  bytes: number;
  rank: number;
  alpha: number;
  /** Base tensor names the adapter adapts, for example "blk.0.attn_q.weight". */
  adapted: string[];
  tensorCount: number;
}

interface LoraTensor {
  name: string;
  /** ggml order: dims[0] is the contiguous dimension. */
  dims: [number, number];
  /** Uniform(-scale, scale) values. */
  scale: number;
}

interface Shape {
  embd: number;
  layers: number;
  heads: number;
  kvHeads: number;
  ff: number;
  vocab: number | undefined;
}

/** The base weight's ggml dims [in, out], as tiny-model.ts lays them out. */
function baseDims(target: TinyLoraTarget, shape: Shape): [number, number] {
  const headDim = shape.embd / shape.heads;
  switch (target) {
    case "attn_q":
      return [shape.embd, shape.heads * headDim];
    case "attn_k":
    case "attn_v":
      return [shape.embd, shape.kvHeads * headDim];
    case "attn_output":
      return [shape.heads * headDim, shape.embd];
    case "ffn_gate":
    case "ffn_up":
      return [shape.embd, shape.ff];
    case "ffn_down":
      return [shape.ff, shape.embd];
    case "output":
      if (shape.vocab === undefined) throw new RangeError("writeTinyLora: adapting output needs vocabSize (the base model's TinyLlamaInfo.vocabSize).");
      return [shape.embd, shape.vocab];
  }
}

function planLora(
  shape: Shape,
  targets: readonly TinyLoraTarget[],
  rank: number,
  alpha: number,
  strength: number,
): { tensors: LoraTensor[]; adapted: string[] } {
  const tensors: LoraTensor[] = [];
  const adapted: string[] = [];
  const names: { target: TinyLoraTarget; name: string }[] = [];
  for (let layer = 0; layer < shape.layers; layer++) {
    for (const target of targets) if (target !== "output") names.push({ target, name: `blk.${layer}.${target}.weight` });
  }
  if (targets.includes("output")) names.push({ target: "output", name: "output.weight" });
  for (const { target, name } of names) {
    const [input, output] = baseDims(target, shape);
    // A has elements of standard deviation 1/√in (uniform ±√(3/in)), so A·x has unit
    // variance per rank component. Then (alpha/rank)·B·A has elements of standard deviation
    // (alpha/rank)·√rank·(1/√in)·σ_B; σ_B = strength·√rank/alpha makes that strength/√in.
    const sigmaB = (strength * Math.sqrt(rank)) / alpha;
    tensors.push(
      { name: `${name}.lora_a`, dims: [input, rank], scale: Math.sqrt(3 / input) },
      { name: `${name}.lora_b`, dims: [rank, output], scale: sigmaB * Math.sqrt(3) },
    );
    adapted.push(name);
  }
  return { tensors, adapted };
}

function positive(value: number, what: string, integer: boolean): number {
  if (!(integer ? Number.isInteger(value) : Number.isFinite(value)) || value <= 0) {
    throw new RangeError(`writeTinyLora: ${what} must be a positive ${integer ? "integer" : "number"}, got ${value}.`);
  }
  return value;
}

/** Writes a LoRA adapter GGUF for a tiny llama model of the given shape and returns what it wrote. */
export async function writeTinyLora(options: TinyLoraOptions): Promise<TinyLoraInfo> {
  const embd = positive(options.embeddingLength ?? 64, "embeddingLength", true);
  const heads = positive(options.heads ?? 4, "heads", true);
  const shape: Shape = {
    embd,
    layers: positive(options.layers ?? 2, "layers", true),
    heads,
    kvHeads: positive(options.kvHeads ?? heads, "kvHeads", true),
    ff: positive(options.feedForwardLength ?? embd * 2, "feedForwardLength", true),
    vocab: options.vocabSize === undefined ? undefined : positive(options.vocabSize, "vocabSize", true),
  };
  if (embd % heads !== 0) throw new RangeError(`writeTinyLora: embeddingLength ${embd} is not a multiple of heads ${heads}.`);
  const rank = positive(options.rank ?? 4, "rank", true);
  const alpha = positive(options.alpha ?? 2 * rank, "alpha", false);
  const strength = positive(options.strength ?? 2, "strength", false);
  const targets = options.targets ?? DEFAULT_LORA_TARGETS;
  if (targets.length === 0) throw new RangeError("writeTinyLora: targets must name at least one matrix.");
  const { tensors, adapted } = planLora(shape, [...new Set(targets)], rank, alpha, strength);

  const metadata: Record<string, TypedMetadataValue> = {
    "general.architecture": { value: options.architecture ?? "llama", type: GGUFValueType.STRING },
    "general.type": { value: "adapter", type: GGUFValueType.STRING },
    "general.name": { value: options.name ?? "llmgw tiny lora", type: GGUFValueType.STRING },
    "general.alignment": { value: GGUF_ALIGNMENT, type: GGUFValueType.UINT32 },
    "adapter.type": { value: "lora", type: GGUFValueType.STRING },
    "adapter.lora.alpha": { value: alpha, type: GGUFValueType.FLOAT32 },
    ...options.extraMetadata,
  };
  const random = createPrng(options.seed ?? 1);
  const written = await writeGguf({
    path: options.path,
    metadata,
    tensors: tensors.map(({ name, dims, scale }) => ({ name, dims, data: (values: Float32Array) => fillUniform(values, random, scale) })),
    caller: "writeTinyLora",
  });
  return { path: options.path, bytes: written.bytes, rank, alpha, adapted, tensorCount: tensors.length };
}
