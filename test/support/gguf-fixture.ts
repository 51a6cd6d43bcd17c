// Writes GGUF files with chosen metadata and tensor infos for the header tests and the
// header benchmark. The tensor data region is left as a hole (the file is extended with
// truncate), so a "7 GB" file takes no disk and no time to write; the header check must
// never read it. Layout per ggml's gguf.md (protocols.md §2): header and key/values
// serialised by @huggingface/gguf, then tensor infos, padding to the alignment, then data
// with each tensor's offset the running sum of the padded sizes before it. For a GGUF that
// llama.cpp actually loads, use tiny-model.ts.
import { open } from "node:fs/promises";
import { GGUFValueType, serializeGgufMetadata, type GGUFTypedMetadata, type MetadataValue } from "@huggingface/gguf";
import { ggmlTensorBytes } from "../../src/gguf/ggml-types.ts";
import { encodeTensorInfo } from "../../src/gguf/gguf-writer.ts";

export interface FixtureValue {
  value: MetadataValue;
  type: GGUFValueType;
  subType?: GGUFValueType;
}

export interface FixtureTensor {
  name: string;
  /** ggml order: dims[0] is the contiguous dimension. */
  dims: number[];
  /** ggml type id (0 F32, 1 F16, 8 Q8_0, 12 Q4_K, 14 Q6_K …). */
  type: number;
  /** Data offset to write instead of the running sum ggml expects (for tests of malformed files). */
  offset?: number;
}

export interface GgufFixtureOptions {
  path: string;
  metadata: Record<string, FixtureValue>;
  tensors: FixtureTensor[];
  /** Default 32. */
  alignment?: number;
}

export interface GgufFixtureInfo {
  fileBytes: number;
  /** Where tensor data starts. */
  headerBytes: number;
  /** Sum of unpadded tensor sizes. */
  tensorBytes: number;
}

const pad = (n: number, alignment: number) => Math.ceil(n / alignment) * alignment;

export const u32 = (value: number): FixtureValue => ({ value, type: GGUFValueType.UINT32 });
export const f32 = (value: number): FixtureValue => ({ value, type: GGUFValueType.FLOAT32 });
export const str = (value: string): FixtureValue => ({ value, type: GGUFValueType.STRING });

export async function writeGgufFixture(options: GgufFixtureOptions): Promise<GgufFixtureInfo> {
  const alignment = options.alignment ?? 32;
  const typed = {
    version: { value: 3, type: GGUFValueType.UINT32 },
    tensor_count: { value: BigInt(options.tensors.length), type: GGUFValueType.UINT64 },
    kv_count: { value: BigInt(Object.keys(options.metadata).length), type: GGUFValueType.UINT64 },
    ...options.metadata,
  } as GGUFTypedMetadata;
  // Alignment 1: the tensor infos follow the key/values directly; only the data is aligned.
  const header = Buffer.from(serializeGgufMetadata(typed, { alignment: 1 }));

  const infos: Buffer[] = [];
  let offset = 0;
  let tensorBytes = 0;
  for (const tensor of options.tensors) {
    const elements = tensor.dims.reduce((a, b) => a * b, 1);
    const bytes = ggmlTensorBytes(tensor.type, elements);
    if (bytes === undefined) throw new RangeError(`writeGgufFixture: unknown ggml type ${tensor.type}`);
    infos.push(encodeTensorInfo({ name: tensor.name, dims: tensor.dims, type: tensor.type, offset: tensor.offset ?? offset }));
    offset += pad(bytes, alignment);
    tensorBytes += bytes;
  }
  const infoBytes = Buffer.concat(infos);
  const headerBytes = pad(header.length + infoBytes.length, alignment);
  const fileBytes = headerBytes + offset;

  const file = await open(options.path, "w");
  try {
    await file.write(header, 0, header.length, 0);
    await file.write(infoBytes, 0, infoBytes.length, header.length);
    await file.truncate(fileBytes);
  } finally {
    await file.close();
  }
  return { fileBytes, headerBytes, tensorBytes };
}

export interface LlamaShape {
  layers: number;
  embedding: number;
  heads: number;
  kvHeads: number;
  feedForward: number;
  vocab: number;
  /** ggml type of the 2-D weights; norms are F32. Default 12 (Q4_K). */
  weightType?: number;
  /** ggml type of token_embd and output. Default weightType. */
  embeddingType?: number;
}

/** The tensor infos of a llama-architecture model of this shape (protocols.md §2). */
export function llamaTensors(shape: LlamaShape): FixtureTensor[] {
  const weight = shape.weightType ?? 12;
  const embd = shape.embeddingType ?? weight;
  const headDim = shape.embedding / shape.heads;
  const tensors: FixtureTensor[] = [
    { name: "token_embd.weight", dims: [shape.embedding, shape.vocab], type: embd },
    { name: "output_norm.weight", dims: [shape.embedding], type: 0 },
    { name: "output.weight", dims: [shape.embedding, shape.vocab], type: embd },
  ];
  for (let i = 0; i < shape.layers; i++) {
    tensors.push(
      { name: `blk.${i}.attn_norm.weight`, dims: [shape.embedding], type: 0 },
      { name: `blk.${i}.attn_q.weight`, dims: [shape.embedding, shape.heads * headDim], type: weight },
      { name: `blk.${i}.attn_k.weight`, dims: [shape.embedding, shape.kvHeads * headDim], type: weight },
      { name: `blk.${i}.attn_v.weight`, dims: [shape.embedding, shape.kvHeads * headDim], type: weight },
      { name: `blk.${i}.attn_output.weight`, dims: [shape.heads * headDim, shape.embedding], type: weight },
      { name: `blk.${i}.ffn_norm.weight`, dims: [shape.embedding], type: 0 },
      { name: `blk.${i}.ffn_gate.weight`, dims: [shape.embedding, shape.feedForward], type: weight },
      { name: `blk.${i}.ffn_down.weight`, dims: [shape.feedForward, shape.embedding], type: weight },
      { name: `blk.${i}.ffn_up.weight`, dims: [shape.embedding, shape.feedForward], type: weight },
    );
  }
  return tensors;
}

/** The llama key/values for this shape; `tokens` adds a tokenizer of that many tokens. */
export function llamaMetadata(shape: LlamaShape & { contextLength: number; fileType?: number; tokens?: number }): Record<string, FixtureValue> {
  const metadata: Record<string, FixtureValue> = {
    "general.architecture": str("llama"),
    "general.name": str("fixture llama"),
    "general.alignment": u32(32),
    "llama.context_length": u32(shape.contextLength),
    "llama.embedding_length": u32(shape.embedding),
    "llama.block_count": u32(shape.layers),
    "llama.feed_forward_length": u32(shape.feedForward),
    "llama.attention.head_count": u32(shape.heads),
    "llama.attention.head_count_kv": u32(shape.kvHeads),
    "llama.attention.layer_norm_rms_epsilon": f32(1e-5),
    "llama.rope.dimension_count": u32(shape.embedding / shape.heads),
  };
  if (shape.fileType !== undefined) metadata["general.file_type"] = u32(shape.fileType);
  if (shape.tokens !== undefined) {
    const tokens = Array.from({ length: shape.tokens }, (_, i) => `tok${i}`);
    metadata["tokenizer.ggml.model"] = str("llama");
    metadata["tokenizer.ggml.tokens"] = { value: tokens, type: GGUFValueType.ARRAY, subType: GGUFValueType.STRING };
    metadata["tokenizer.ggml.scores"] = { value: tokens.map(() => 0), type: GGUFValueType.ARRAY, subType: GGUFValueType.FLOAT32 };
    metadata["tokenizer.ggml.token_type"] = { value: tokens.map(() => 1), type: GGUFValueType.ARRAY, subType: GGUFValueType.INT32 };
  } else {
    metadata["llama.vocab_size"] = u32(shape.vocab);
  }
  return metadata;
}
