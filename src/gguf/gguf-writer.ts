// Writer of small GGUF v3 files with F32 tensors, shared by the test-support generators
// (tiny-model.ts, tiny-projector.ts, tiny-lora.ts), so the layout rules live in one place
// and the generators only say which keys and tensors they want.
//
// Layout rules come from ggml's gguf.md and llama.cpp's reader (ggml/src/gguf.cpp; see
// shared/reference/protocols.md §2): the header and key/values, then the tensor infos
// directly after them, then padding to the alignment (32, ggml's default and what the
// generators declare in `general.alignment`), then the data, each tensor's offset being the
// running sum of the padded sizes of the tensors before it. The header and key/values are
// serialised with @huggingface/gguf; the tensor infos and data are written here, one tensor
// at a time, so a wide model never sits in memory whole.
import { open } from "node:fs/promises";
import { GGUFValueType, serializeGgufMetadata, type GGUFTypedMetadata, type MetadataValue } from "@huggingface/gguf";

export { GGUFValueType };

/** One typed key/value, in @huggingface/gguf's typed-metadata form. */
export interface TypedMetadataValue {
  value: MetadataValue;
  type: GGUFValueType;
  /** Element type of an ARRAY value. */
  subType?: GGUFValueType;
}

/** The data alignment the writer uses; generators declare it as `general.alignment`. */
export const GGUF_ALIGNMENT = 32;

/** ggml's type id of 32-bit floats, the only tensor type the writer produces. */
export const GGML_TYPE_F32 = 0;

export interface GgufTensor {
  name: string;
  /** ggml order: dims[0] is the contiguous dimension. */
  dims: readonly number[];
  /**
   * The values, as many as the dims hold, or a function that fills a zeroed array of that
   * size. Fill functions run in tensor order, one at a time, so a generator that draws from
   * one seeded PRNG across its tensors gets the same bytes for the same seed.
   */
  data: Float32Array | ((values: Float32Array) => void);
}

export interface WriteGgufOptions {
  /** Where to write the file (overwritten if present). */
  path: string;
  /** Key/values in file order; the version and the counts are added in front. */
  metadata: Record<string, TypedMetadataValue>;
  tensors: readonly GgufTensor[];
  /** Names the generator in error messages. Default "writeGguf". */
  caller?: string;
}

export interface WrittenGguf {
  /** File size in bytes. */
  bytes: number;
  /** Number of values over all tensors. */
  parameterCount: number;
}

/** mulberry32: small, fast and deterministic; quality is irrelevant for random weights. */
export function createPrng(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Fills `values` with uniform(-scale, scale) draws from `random`, in index order. */
export function fillUniform(values: Float32Array, random: () => number, scale: number): void {
  for (let i = 0; i < values.length; i++) values[i] = (random() * 2 - 1) * scale;
}

const padded = (n: number) => Math.ceil(n / GGUF_ALIGNMENT) * GGUF_ALIGNMENT;
const elementsOf = (dims: readonly number[]) => dims.reduce((a, b) => a * b, 1);

/** One GGUF tensor info: name, dims, ggml type and data offset, as ggml reads it. */
export function encodeTensorInfo(tensor: { name: string; dims: readonly number[]; type: number; offset: number }): Buffer {
  const name = Buffer.from(tensor.name, "utf8");
  const info = Buffer.alloc(8 + name.length + 4 + 8 * tensor.dims.length + 4 + 8);
  let at = info.writeBigUInt64LE(BigInt(name.length), 0);
  at += name.copy(info, at);
  at = info.writeUInt32LE(tensor.dims.length, at);
  for (const dim of tensor.dims) at = info.writeBigUInt64LE(BigInt(dim), at);
  at = info.writeUInt32LE(tensor.type, at);
  info.writeBigUInt64LE(BigInt(tensor.offset), at);
  return info;
}

/** The GGUF v3 fixed header (magic, version, counts) and key/values, unpadded: the tensor infos follow directly. */
export function encodeGgufHeader(metadata: Record<string, TypedMetadataValue>, tensorCount: number): Buffer {
  const typed = {
    version: { value: 3, type: GGUFValueType.UINT32 },
    tensor_count: { value: BigInt(tensorCount), type: GGUFValueType.UINT64 },
    kv_count: { value: BigInt(Object.keys(metadata).length), type: GGUFValueType.UINT64 },
    ...metadata,
  } as GGUFTypedMetadata;
  // serializeGgufMetadata pads its output to the alignment, but the tensor infos must
  // follow the key/values directly; alignment 1 means "no padding".
  return Buffer.from(serializeGgufMetadata(typed, { alignment: 1 }));
}

/** Writes a GGUF v3 file of F32 tensors and returns its size and parameter count. */
export async function writeGguf(options: WriteGgufOptions): Promise<WrittenGguf> {
  const caller = options.caller ?? "writeGguf";
  const header = encodeGgufHeader(options.metadata, options.tensors.length);
  const infos: Buffer[] = [];
  let offset = 0;
  for (const tensor of options.tensors) {
    const count = elementsOf(tensor.dims);
    if (tensor.data instanceof Float32Array && tensor.data.length !== count) {
      throw new RangeError(`${caller}: tensor ${tensor.name} has ${tensor.data.length} values, where its dims [${tensor.dims.join(", ")}] hold ${count}.`);
    }
    infos.push(encodeTensorInfo({ name: tensor.name, dims: tensor.dims, type: GGML_TYPE_F32, offset }));
    offset += padded(count * 4);
  }
  const infoBytes = Buffer.concat(infos);
  const dataStart = padded(header.length + infoBytes.length);

  let parameterCount = 0;
  const file = await open(options.path, "w");
  try {
    let position = 0;
    const write = async (bytes: Uint8Array) => {
      await file.write(bytes, 0, bytes.length, position);
      position += bytes.length;
    };
    await write(header);
    await write(infoBytes);
    await write(Buffer.alloc(dataStart - position));
    for (const tensor of options.tensors) {
      const count = elementsOf(tensor.dims);
      parameterCount += count;
      let values: Float32Array;
      if (tensor.data instanceof Float32Array) values = tensor.data;
      else {
        values = new Float32Array(count);
        tensor.data(values);
      }
      const bytes = Buffer.from(values.buffer, values.byteOffset, values.byteLength);
      await write(bytes);
      await write(Buffer.alloc(padded(bytes.length) - bytes.length));
    }
    return { bytes: position, parameterCount };
  } finally {
    await file.close();
  }
}
