// What a LoRA adapter GGUF is and which base model it fits, from its header alone. An
// adapter is added to a model of the catalog and applied on that model's replicas; a file
// that is not an adapter, or one made for another base, must be refused when it is added,
// with both values named, rather than fail on every replica (llama.cpp's own message names
// neither: "model arch and LoRA arch mismatch", "tensor 'blk.0.attn_q.weight' has incorrect
// shape (hint: maybe wrong base model?)").
//
// The rules are llama.cpp's loader's (src/llama-adapter.cpp, llama_adapter_lora_init_impl,
// at 80fb11ac, the source node-llama-cpp bundles; details in tiny-lora.ts's header):
// `general.type` "adapter" and `adapter.type` "lora" as strings, `adapter.lora.alpha` as
// FLOAT32 when present (the loader asserts these types and would abort the engine), tensors
// named `<base>.lora_a` / `<base>.lora_b` in pairs (norm vectors ending `_norm.weight` are
// ignored), lora_a [in, rank] and lora_b [rank, out] in ggml order, flipped for token_embd.
//
// Adapters made by convert_lora_to_gguf.py carry no `<arch>.embedding_length` (it writes
// only the adapter keys), so the embedding size the adapter was made for is read from the
// tensor shapes: the input side of a matrix that reads the residual stream (attention
// q/k/v, ffn gate/up, output), or the output side of one that writes it (attention output,
// ffn down), or token_embd's lora_b. The rank is lora_b's ne[0], as llama.cpp takes it for
// the alpha / rank scale.
import { GGUFValueType, type GGUFTensorInfo } from "@huggingface/gguf";
import { BadRequestError } from "../core/errors.ts";
import { readGgufHeader, type GgufHeaderSummary, type GgufSource } from "./header.ts";

/** The parts of a parsed GGUF header this module reads (@huggingface/gguf's typed form). */
export interface GgufHeaderView {
  /** The file path or URL, for messages. */
  source: string;
  typedMetadata: Record<string, { value: unknown; type: GGUFValueType } | undefined>;
  tensorInfos: Pick<GGUFTensorInfo, "name" | "shape">[];
}

export interface LoraAdapterInfo {
  source: string;
  /** `general.architecture`: the architecture of the base model it was made for. */
  architecture: string;
  name?: string;
  /** The base model's embedding size (n_embd) the tensors were made for; absent when no adapted matrix reveals it. */
  embeddingLength?: number;
  /** The base tensor whose adapter shape gave embeddingLength, for messages. */
  embeddingFrom?: string;
  /** The LoRA rank (lora_b's ne[0]); the largest one when tensors differ. */
  rank: number;
  /** `adapter.lora.alpha`; absent when the file has none (llama.cpp then scales by the user's scale alone). */
  alpha?: number;
  /** Base tensor names the adapter changes, for example "blk.0.attn_q.weight". */
  adapted: string[];
  /** Highest block index adapted + 1: the base needs at least this many layers (0 when no block is adapted). */
  layers: number;
}

/** What checkAdapterFitsModel compares: a GGUF header summary of the base model fits. */
export type AdapterBaseModel = Pick<GgufHeaderSummary, "architecture" | "embeddingLength" | "blockCount"> & { source?: string };

// Matrices whose input (lora_a's ne[0]) or output (lora_b's ne[1]) is the residual stream,
// whose width is n_embd. Others (ffn_down's input is the feed-forward width, attn_output's
// input is heads × head size) say nothing about n_embd on that side.
const READS_RESIDUAL = /^(?:blk\.\d+\.(?:attn_q|attn_k|attn_v|attn_qkv|ffn_gate|ffn_up)\.weight|output\.weight)$/;
const WRITES_RESIDUAL = /^blk\.\d+\.(?:attn_output|ffn_down)\.weight$/;
const TOKEN_EMBD = "token_embd.weight";

const invalid = (source: string, why: string) =>
  new BadRequestError(`${source} is not a LoRA adapter llama.cpp can load: ${why}. Convert the adapter again with llama.cpp's convert_lora_to_gguf.py.`, {
    code: "invalid_lora_adapter",
  });

function typeName(type: GGUFValueType): string {
  return (GGUFValueType as unknown as Record<number, string>)[type] ?? `type ${type}`;
}

/** A string key's value; refuses another type, which llama.cpp's gguf_get_val_str would abort on. */
function stringKey(header: GgufHeaderView, key: string): string | undefined {
  const entry = header.typedMetadata[key];
  if (entry === undefined) return undefined;
  if (entry.type !== GGUFValueType.STRING || typeof entry.value !== "string") {
    throw invalid(header.source, `its ${key} is a ${typeName(entry.type)}, where llama.cpp reads a STRING (and stops the engine on any other type)`);
  }
  return entry.value;
}

interface Pair {
  a?: Pick<GGUFTensorInfo, "name" | "shape">;
  b?: Pick<GGUFTensorInfo, "name" | "shape">;
}

/** Describes a LoRA adapter from its parsed header, or throws a BadRequestError saying why the file is not one. */
export function describeLoraAdapter(header: GgufHeaderView): LoraAdapterInfo {
  const { source } = header;
  const generalType = stringKey(header, "general.type");
  if (generalType !== "adapter") {
    const architecture = header.typedMetadata["general.architecture"]?.value;
    const looksLike = typeof architecture === "string" ? ` It looks like a ${architecture} model with ${header.tensorInfos.length} tensors.` : "";
    throw new BadRequestError(
      `${source} is not a LoRA adapter: its general.type is ${generalType === undefined ? "missing" : JSON.stringify(generalType)}, where an adapter's is "adapter".${looksLike} ` +
        "Give the adapter's GGUF file (as llama.cpp's convert_lora_to_gguf.py writes it), not a model.",
      { code: "not_lora_adapter" },
    );
  }
  const adapterType = stringKey(header, "adapter.type");
  if (adapterType !== "lora") {
    throw new BadRequestError(
      `${source} is an adapter of type ${adapterType === undefined ? "(missing adapter.type)" : JSON.stringify(adapterType)}, not a LoRA adapter ("lora"); llama.cpp applies only LoRA adapters.`,
      { code: "not_lora_adapter" },
    );
  }
  const architecture = stringKey(header, "general.architecture");
  if (architecture === undefined || architecture === "") throw invalid(source, "it has no general.architecture, the base model's architecture");

  let alpha: number | undefined;
  const alphaEntry = header.typedMetadata["adapter.lora.alpha"];
  if (alphaEntry !== undefined) {
    if (alphaEntry.type !== GGUFValueType.FLOAT32 || typeof alphaEntry.value !== "number") {
      throw invalid(
        source,
        `its adapter.lora.alpha is a ${typeName(alphaEntry.type)}, where llama.cpp reads a FLOAT32 (and stops the engine on any other type)`,
      );
    }
    // llama.cpp treats an alpha of 0 as "no alpha": the product is then scaled by the user's scale alone.
    if (alphaEntry.value !== 0) alpha = alphaEntry.value;
  }

  const pairs = new Map<string, Pair>();
  for (const tensor of header.tensorInfos) {
    const half = tensor.name.endsWith(".lora_a") ? "a" : tensor.name.endsWith(".lora_b") ? "b" : undefined;
    if (half === undefined) {
      if (tensor.name.endsWith("_norm.weight")) continue;
      throw invalid(source, `its tensor '${tensor.name}' is neither a lora_a nor a lora_b half`);
    }
    const base = tensor.name.slice(0, -".lora_a".length);
    const pair = pairs.get(base) ?? {};
    pair[half] = tensor;
    pairs.set(base, pair);
  }
  if (pairs.size === 0) throw invalid(source, "it holds no lora_a/lora_b tensors");

  let rank = 0;
  let layers = 0;
  let embedding: { length: number; from: string } | undefined;
  let embeddingPriority = 3;
  for (const [base, { a, b }] of pairs) {
    if (!a || !b) throw invalid(source, `the tensor pair of '${base}' lacks its lora_${a ? "b" : "a"} half`);
    if (a.shape.length !== 2 || b.shape.length !== 2) throw invalid(source, `the tensors of '${base}' are not matrices`);
    const [aIn, aOut] = a.shape.map(Number) as [number, number];
    const [bIn, bOut] = b.shape.map(Number) as [number, number];
    // token_embd's pair is stored flipped (llm_build_inp_embd reads rows of lora_a).
    if (base !== TOKEN_EMBD && aOut !== bIn) {
      throw invalid(
        source,
        `'${base}' has lora_a of rank ${aOut} but lora_b of rank ${bIn} (a lora_a that is not transposed, as older finetune tools wrote it)`,
      );
    }
    rank = Math.max(rank, bIn);
    const block = /^blk\.(\d+)\./.exec(base);
    if (block) layers = Math.max(layers, Number(block[1]) + 1);
    // Prefer a matrix reading the residual stream, the most common kind of adapted matrix.
    const candidate: [number, number] | undefined = READS_RESIDUAL.test(base)
      ? [0, aIn]
      : WRITES_RESIDUAL.test(base)
        ? [1, bOut]
        : base === TOKEN_EMBD
          ? [2, bOut]
          : undefined;
    if (candidate && candidate[0] < embeddingPriority) {
      embeddingPriority = candidate[0];
      embedding = { length: candidate[1], from: base };
    }
  }

  const name = header.typedMetadata["general.name"]?.value;
  return {
    source,
    architecture,
    ...(typeof name === "string" ? { name } : {}),
    ...(embedding ? { embeddingLength: embedding.length, embeddingFrom: embedding.from } : {}),
    rank,
    ...(alpha === undefined ? {} : { alpha }),
    adapted: [...pairs.keys()],
    layers,
  };
}

/**
 * Null when the adapter fits the model, else one sentence naming each mismatch with both
 * values. Checks what llama.cpp checks at load that a header shows: the architecture, the
 * embedding size (the shape check) and that every adapted layer exists.
 */
export function checkAdapterFitsModel(adapter: LoraAdapterInfo, model: AdapterBaseModel): string | null {
  const problems: string[] = [];
  if (adapter.architecture !== model.architecture) {
    problems.push(`it is for architecture ${adapter.architecture}, the model is ${model.architecture}`);
  }
  if (adapter.embeddingLength !== undefined && model.embeddingLength > 0 && adapter.embeddingLength !== model.embeddingLength) {
    problems.push(`it was made for embedding size ${adapter.embeddingLength} (from ${adapter.embeddingFrom}), the model's is ${model.embeddingLength}`);
  }
  if (model.blockCount > 0 && adapter.layers > model.blockCount) {
    problems.push(`it adapts layer ${adapter.layers - 1} (blk.${adapter.layers - 1}), the model has ${model.blockCount} layers`);
  }
  if (problems.length === 0) return null;
  const modelName = model.source === undefined ? "the model" : `model ${model.source}`;
  return `Adapter ${adapter.source} does not fit ${modelName}: ${problems.join("; ")}.`;
}

/**
 * Reads a LoRA adapter's header from a file or URL and describes it. The project's header
 * reader parses it, so a file that is not a GGUF, is cut short or is malformed gets its
 * messages, and keeps the typed key/values and tensor shapes this module reads.
 */
export async function readLoraAdapter(source: GgufSource): Promise<LoraAdapterInfo> {
  const summary = await readGgufHeader(source, { keepParsed: true });
  if (!summary.parsed) throw new Error(`readLoraAdapter: the header reader kept no parsed header of ${summary.source}.`);
  return describeLoraAdapter({
    source: summary.source,
    typedMetadata: summary.parsed.typedMetadata as unknown as GgufHeaderView["typedMetadata"],
    tensorInfos: summary.parsed.tensorInfos,
  });
}
