// Storage sizes of ggml tensor types, so a tensor's byte size can be computed from its
// shape and type without reading its data: bytes = elements / blockSize × typeSize.
//
// The table was produced by calling ggml_type_name, ggml_blck_size and ggml_type_size
// for every type id in the prebuilt libggml-base.so that node-llama-cpp 3.21.1 ships
// (llama.cpp release v0.4.0, commit 5b4ebc5; see llama-support.ts), so it matches the
// engine the nodes run. Ids 4, 5 and 31–38 were removed from ggml and have no size.

export interface GgmlTypeInfo {
  /** ggml's own name, for example "q4_K". */
  name: string;
  /** Elements per block; ne0 must be a multiple of it. */
  blockSize: number;
  /** Bytes per block. */
  typeSize: number;
}

export const GGML_TYPES: ReadonlyMap<number, GgmlTypeInfo> = new Map<number, GgmlTypeInfo>(
  (
    [
      [0, "f32", 1, 4],
      [1, "f16", 1, 2],
      [2, "q4_0", 32, 18],
      [3, "q4_1", 32, 20],
      [6, "q5_0", 32, 22],
      [7, "q5_1", 32, 24],
      [8, "q8_0", 32, 34],
      [9, "q8_1", 32, 36],
      [10, "q2_K", 256, 84],
      [11, "q3_K", 256, 110],
      [12, "q4_K", 256, 144],
      [13, "q5_K", 256, 176],
      [14, "q6_K", 256, 210],
      [15, "q8_K", 256, 292],
      [16, "iq2_xxs", 256, 66],
      [17, "iq2_xs", 256, 74],
      [18, "iq3_xxs", 256, 98],
      [19, "iq1_s", 256, 50],
      [20, "iq4_nl", 32, 18],
      [21, "iq3_s", 256, 110],
      [22, "iq2_s", 256, 82],
      [23, "iq4_xs", 256, 136],
      [24, "i8", 1, 1],
      [25, "i16", 1, 2],
      [26, "i32", 1, 4],
      [27, "i64", 1, 8],
      [28, "f64", 1, 8],
      [29, "iq1_m", 256, 56],
      [30, "bf16", 1, 2],
      [34, "tq1_0", 256, 54],
      [35, "tq2_0", 256, 66],
      [39, "mxfp4", 32, 17],
      [40, "nvfp4", 64, 36],
      [41, "q1_0", 128, 18],
      [42, "q2_0", 64, 18],
    ] as const
  ).map(([id, name, blockSize, typeSize]) => [id, { name, blockSize, typeSize }]),
);

/** Bytes of a tensor of `type` with `elements` elements, or undefined for an unknown type. */
export function ggmlTensorBytes(type: number, elements: number): number | undefined {
  const info = GGML_TYPES.get(type);
  if (!info) return undefined;
  return Math.ceil(elements / info.blockSize) * info.typeSize;
}
