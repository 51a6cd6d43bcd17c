// Generator of tiny vision projectors (llama.cpp "mmproj" GGUF files) for the tiny llama
// of ./tiny-model.ts, so tests can send an image to a real `llama-server --mmproj` without
// downloading a model. The weights are random (a seeded PRNG, so one seed always gives
// the same bytes); what matters is that llama.cpp's mtmd/clip code loads the file, turns
// an image into a few embeddings of the language model's width, and that two different
// images give clearly different embeddings, so they change the model's greedy answer.
//
// The projector is the LLaVA-1.5 kind (`clip.projector_type` = "mlp"): a CLIP ViT whose
// patches go through a two-layer MLP (linear, GELU, linear). Of the projectors the
// llama.cpp commit in use loads (tools/mtmd/clip-impl.h, PROJECTOR_TYPE_NAMES), it needs
// the fewest keys and tensors: no special image tokens, no merging, no resampler, and a
// fixed image size. The facts below are from that commit's tools/mtmd sources.
//
// Keys (clip.cpp, clip_model_loader; a key of the wrong type aborts, because
// gguf_get_val_u32/_f32/_bool assert the type):
// - `clip.has_vision_encoder` BOOL true: without it clip_init builds no vision context and
//   mtmd fails with "Failed to load CLIP model" (constructor and clip_init).
// - `clip.projector_type` STRING "mlp" (load_hparams; clip_projector_type_from_string).
// - `clip.vision.embedding_length`, `.attention.head_count`, `.feed_forward_length`,
//   `.block_count`, `.projection_dim` UINT32, and `clip.vision.attention.layer_norm_epsilon`
//   FLOAT32: all required by load_hparams ("Key not found: ..." otherwise).
//   `projection_dim` is read but unused by the mlp projector.
// - `clip.vision.image_size`, `clip.vision.patch_size` UINT32, required for vision.
//   image_size <= 8192 and 0 < patch_size < 65536 (load_hparams sanity checks).
// - `clip.vision.image_mean`, `clip.vision.image_std`: ARRAY of FLOAT32 with at least 3
//   items (load_hparams throws otherwise, although get_arr_f32 is called as optional).
// - Optional and left out: `clip.use_gelu`/`clip.use_silu` (the ViT feed-forward then uses
//   GELU-quick), `clip.vision.image_grid_pinpoints` (none means the fixed-size
//   preprocessor: mtmd.cpp init_vision), `clip.vision.feature_layer`.
// - `general.architecture` "clip" is not read by clip.cpp; real mmproj files carry it and
//   the project's GGUF header reader needs an architecture.
//
// Tensors (clip.cpp load_tensors, graph in models/llava.cpp, clip_graph::build_inp). Shapes
// are ggml order (ne0 first, the contiguous dimension); all F32 here. E is the vision width,
// P the patch size, N the patch count (image_size / P)^2, T the text model's width.
// - `v.patch_embd.weight` [P, P, 3, E]: the conv2d kernel of build_inp (optional at load,
//   dereferenced by the graph).
// - `v.position_embd.weight` [E, N]: get_rows by patch position (same); with no
//   `v.class_embd` there are N positions, not N + 1.
// - Per layer i < block_count, `v.blk.i.attn_out.weight` [E, E], `v.blk.i.ffn_up.weight`
//   [E, F], `v.blk.i.ffn_down.weight` [F, E] are required at load; `v.blk.i.attn_q/k/v.weight`
//   [E, E] are optional at load but used by the graph of every layer it runs. Norms and
//   biases are optional (build_norm without weights only normalises). F must differ from E:
//   a down projection with ne0 = E is taken for a legacy file with up and down swapped.
// - `mm.0.weight` [E, T], `mm.0.bias` [T], `mm.2.weight` [T, T], `mm.2.bias` [T]: optional at
//   load, but clip_n_mmproj_embd reads `mm.2.weight` ne[1] for the mlp projector (a null
//   dereference without it), and mtmd.cpp refuses a projector whose width differs from the
//   text model's ("mismatch between text model (n_embd = ...) and mmproj").
//
// The llava graph runs the ViT up to the second-to-last layer (models/llava.cpp: il_last =
// n_layer - 1), as LLaVA takes CLIP's penultimate hidden state; so with the default two
// layers one runs and the second is loaded but unused. An image becomes N embeddings
// (clip_n_output_tokens: nothing merged for mlp).
//
// The file layout (GGUF v3, alignment 32, offsets) is ./gguf-writer.ts's.
import { GGUFValueType, GGUF_ALIGNMENT, createPrng, fillUniform, writeGguf, type TypedMetadataValue } from "./gguf-writer.ts";

export interface TinyProjectorOptions {
  /** Where to write the file (overwritten if present). */
  path: string;
  /** The language model's n_embd: the width of the embeddings the projector emits (64 for the default tiny llama). */
  textEmbeddingLength: number;
  /** Seed of the weight PRNG; the same seed and shape give the same bytes. Default 1. */
  seed?: number;
  /** Side of the square image the encoder sees (llama.cpp resizes every image to it). Default 32. */
  imageSize?: number;
  /** Side of a patch; must divide imageSize. Default 16, so an image is 4 embeddings. */
  patchSize?: number;
  /** Width of the vision transformer. Default 32. */
  embeddingLength?: number;
  /** Vision transformer layers; the llava graph runs all but the last. Default 2. */
  layers?: number;
  /** Attention heads; must divide embeddingLength. Default 2. */
  heads?: number;
  /** Feed-forward width of a vision layer; must differ from embeddingLength. Default 2 × embeddingLength. */
  feedForwardLength?: number;
  /** general.name. Default "llmgw tiny projector". */
  name?: string;
}

export interface TinyProjectorInfo {
  path: string;
  /** File size in bytes. */
  bytes: number;
  /** Number of weights over all tensors. */
  parameterCount: number;
  tensorCount: number;
  /** Tensor names in file order. */
  tensorNames: string[];
  /** Embeddings one image becomes: (imageSize / patchSize)². */
  imageTokens: number;
  imageSize: number;
  patchSize: number;
}

/** The projector type written; the LLaVA-1.5 MLP. */
export const TINY_PROJECTOR_TYPE = "mlp";

interface TensorPlan {
  name: string;
  /** ggml order: dims[0] is the contiguous dimension. */
  dims: number[];
  /** Uniform(-scale, scale); 0 writes zeros. */
  scale: number;
}

interface Shape {
  embd: number;
  layers: number;
  ff: number;
  text: number;
  patch: number;
  patches: number;
}

function planTensors(shape: Shape): TensorPlan[] {
  const { embd, layers, ff, text, patch, patches } = shape;
  // Uniform(-a, a) with a = sqrt(3 / fan_in) keeps activations at unit variance.
  const linear = (fanIn: number) => Math.sqrt(3 / fanIn);
  const plan: TensorPlan[] = [
    // Pixels arrive normalised to [-1, 1]; unit-variance patch embeddings follow.
    { name: "v.patch_embd.weight", dims: [patch, patch, 3, embd], scale: linear(3 * patch * patch) },
    // Small next to the patch embeddings, so what the image shows dominates where it is.
    { name: "v.position_embd.weight", dims: [embd, patches], scale: 0.1 },
  ];
  for (let layer = 0; layer < layers; layer++) {
    const p = `v.blk.${layer}.`;
    plan.push(
      { name: `${p}attn_q.weight`, dims: [embd, embd], scale: linear(embd) },
      { name: `${p}attn_k.weight`, dims: [embd, embd], scale: linear(embd) },
      { name: `${p}attn_v.weight`, dims: [embd, embd], scale: linear(embd) },
      { name: `${p}attn_out.weight`, dims: [embd, embd], scale: linear(embd) },
      { name: `${p}ffn_up.weight`, dims: [embd, ff], scale: linear(embd) },
      { name: `${p}ffn_down.weight`, dims: [ff, embd], scale: linear(ff) },
    );
  }
  plan.push(
    { name: "mm.0.weight", dims: [embd, text], scale: linear(embd) },
    { name: "mm.0.bias", dims: [text], scale: 0 },
    // Twice unit variance: image embeddings then stand out next to the tiny llama's token
    // embeddings (uniform in [-1, 1]), which helps them move its greedy answer.
    { name: "mm.2.weight", dims: [text, text], scale: 2 * linear(text) },
    { name: "mm.2.bias", dims: [text], scale: 0 },
  );
  return plan;
}

function positiveInt(value: number, what: string): number {
  if (!Number.isInteger(value) || value <= 0) throw new RangeError(`writeTinyProjector: ${what} must be a positive integer, got ${value}.`);
  return value;
}

/** Writes a tiny LLaVA-style (mlp) projector GGUF with random F32 weights and returns what it wrote. */
export async function writeTinyProjector(options: TinyProjectorOptions): Promise<TinyProjectorInfo> {
  const text = positiveInt(options.textEmbeddingLength, "textEmbeddingLength");
  const imageSize = positiveInt(options.imageSize ?? 32, "imageSize");
  const patch = positiveInt(options.patchSize ?? 16, "patchSize");
  const embd = positiveInt(options.embeddingLength ?? 32, "embeddingLength");
  const layers = positiveInt(options.layers ?? 2, "layers");
  const heads = positiveInt(options.heads ?? 2, "heads");
  const ff = positiveInt(options.feedForwardLength ?? embd * 2, "feedForwardLength");
  if (imageSize % patch !== 0) throw new RangeError(`writeTinyProjector: patchSize ${patch} does not divide imageSize ${imageSize}.`);
  if (imageSize > 8192) throw new RangeError(`writeTinyProjector: imageSize ${imageSize} is above llama.cpp's limit of 8192.`);
  if (embd % heads !== 0) throw new RangeError(`writeTinyProjector: embeddingLength ${embd} is not a multiple of heads ${heads}.`);
  if (ff === embd) {
    throw new RangeError(
      `writeTinyProjector: feedForwardLength must differ from embeddingLength (${embd}); llama.cpp would take the file for one with swapped ffn tensors.`,
    );
  }
  const patches = (imageSize / patch) ** 2;
  const plan = planTensors({ embd, layers, ff, text, patch, patches });

  const u32 = (value: number): TypedMetadataValue => ({ value, type: GGUFValueType.UINT32 });
  const f32 = (value: number): TypedMetadataValue => ({ value, type: GGUFValueType.FLOAT32 });
  const f32s = (value: number[]): TypedMetadataValue => ({ value, type: GGUFValueType.ARRAY, subType: GGUFValueType.FLOAT32 });
  const metadata: Record<string, TypedMetadataValue> = {
    "general.architecture": { value: "clip", type: GGUFValueType.STRING },
    "general.name": { value: options.name ?? "llmgw tiny projector", type: GGUFValueType.STRING },
    "general.alignment": u32(GGUF_ALIGNMENT),
    "general.file_type": u32(0), // ALL_F32
    "clip.has_vision_encoder": { value: true, type: GGUFValueType.BOOL },
    "clip.projector_type": { value: TINY_PROJECTOR_TYPE, type: GGUFValueType.STRING },
    "clip.vision.image_size": u32(imageSize),
    "clip.vision.patch_size": u32(patch),
    "clip.vision.embedding_length": u32(embd),
    "clip.vision.feed_forward_length": u32(ff),
    "clip.vision.block_count": u32(layers),
    "clip.vision.attention.head_count": u32(heads),
    "clip.vision.attention.layer_norm_epsilon": f32(1e-5),
    "clip.vision.projection_dim": u32(text),
    // Mean and std of one half map pixel values 0..255 onto [-1, 1]: black and white are opposites.
    "clip.vision.image_mean": f32s([0.5, 0.5, 0.5]),
    "clip.vision.image_std": f32s([0.5, 0.5, 0.5]),
  };

  const random = createPrng(options.seed ?? 1);
  const tensors = plan.map(({ name, dims, scale }) => ({
    name,
    dims,
    data: (values: Float32Array) => {
      if (scale !== 0) fillUniform(values, random, scale);
    },
  }));
  const written = await writeGguf({ path: options.path, metadata, tensors, caller: "writeTinyProjector" });
  return {
    path: options.path,
    bytes: written.bytes,
    parameterCount: written.parameterCount,
    tensorCount: plan.length,
    tensorNames: plan.map((tensor) => tensor.name),
    imageTokens: patches,
    imageSize,
    patchSize: patch,
  };
}
