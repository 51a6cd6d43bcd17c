// GGUF header check: reads only the header of a GGUF file (key/values and tensor infos,
// never tensor data), from the mirror or the Hub over HTTP range requests or from a local
// file, and summarises what the serve job and the planner need: architecture, size,
// quantisation and the attention shape that decides the KV cache.
//
// Parsing is @huggingface/gguf's. That library always asks for 2 MB chunks (its
// HTTP_CHUNK_SIZE), which is more than the header of most files and would read 0.2% of a
// 1 GiB file; so it parses from a prefix that this module fetches itself, starting at
// 256 KiB and doubling. The library is given a fetch that answers from the prefix, padding
// a short chunk with filler, so a parse only counts when the header it found ends inside
// the real bytes (`tensorInfoByteRange[1] <= prefix length`). Otherwise, or when the
// library asks beyond the prefix or fails on the filler, the prefix doubles and the parse
// runs again. Every byte that comes over the wire or off the disk is counted in
// `bytesRead`.
//
// A header that parses is not yet a file llama.cpp loads: the tensor infos must also
// place every tensor's data where ggml expects it and inside the file (see
// `checkTensorLayout`). A GGUF cut after its header (an interrupted copy) is refused here,
// so the plan, the catalog and the agent all refuse it the same way.
import { open, type FileHandle } from "node:fs/promises";
import { fetch as undiciFetch, type Dispatcher } from "undici";
import {
  GGMLFileQuantizationType,
  GGMLQuantizationType,
  gguf,
  type GGUFParseOutput,
  type GGUFTensorInfo,
  type GGUFTypedMetadata,
  type MetadataValue,
} from "@huggingface/gguf";
import { BadRequestError, LlmgwError, NotFoundError, UpstreamError, describeError } from "../core/errors.ts";
import { formatBytes } from "../core/format.ts";
import { ggmlTensorBytes } from "./ggml-types.ts";

/** The part of a fetch Response this module uses; global fetch and undici's both fit. */
export interface FetchResponseLike {
  status: number;
  headers: { get(name: string): string | null };
  body: ReadableStream<Uint8Array> | null;
}

export type FetchLike = (url: string, init: { headers: Record<string, string>; signal?: AbortSignal }) => Promise<FetchResponseLike>;

export interface GgufUrlSource {
  url: string;
  /** Extra request headers, for example the node credential for the mirror or a Hub token. */
  headers?: Record<string, string>;
  /** undici dispatcher for the default fetch (timeouts, connection pool). */
  dispatcher?: Dispatcher;
  /** A fetch to use instead of undici's (tests, proxies). Takes precedence over `dispatcher`. */
  fetch?: FetchLike;
  signal?: AbortSignal;
}

export interface GgufFileSource {
  file: string;
  signal?: AbortSignal;
}

export type GgufSource = GgufUrlSource | GgufFileSource;

export interface ReadGgufHeaderOptions {
  /** First prefix to fetch, in bytes. Default 256 KiB. */
  initialBytes?: number;
  /** Largest header accepted, in bytes. Default 48 MB (the library's buffer holds 50 MB). */
  maxHeaderBytes?: number;
  /** Also return the typed key/values and the tensor infos (`GgufHeaderSummary.parsed`), for readers that need more than the summary. */
  keepParsed?: boolean;
}

export interface GgufHeaderSummary {
  /** The file path, or the URL without its query string. */
  source: string;
  ggufVersion: number;
  architecture: string;
  name?: string;
  /** Sum of the elements of every tensor in this file (this shard only, for split files). */
  parameterCount: number;
  /** `general.file_type` (llama_ftype) when present, without the "guessed" flag. */
  fileType?: number;
  /** For example "Q4_K_M"; from `general.file_type`, else the tensor type holding the most bytes (for example "Q4_K"). */
  quantisation: string;
  quantisationFrom: "general.file_type" | "tensor types";
  contextLength: number;
  embeddingLength: number;
  blockCount: number;
  feedForwardLength?: number;
  /** Attention heads (the largest, where the file gives one per layer). */
  headCount: number;
  /** KV heads (the largest, where the file gives one per layer); defaults to headCount. */
  headCountKv: number;
  /** KV heads per layer, when the file gives an array (OpenELM, some hybrid models). */
  headCountKvPerLayer?: number[];
  /** Per-head key and value sizes; default embeddingLength / headCount. */
  keyLength: number;
  valueLength: number;
  vocabSize?: number;
  /** From gguf-split's keys: `no` is 0-based as written there. */
  split?: { no: number; count: number };
  /** Whether `tokenizer.chat_template` is present. */
  chatTemplate: boolean;
  /** `<arch>.pooling_type` (llama.cpp: NONE 0, MEAN 1, CLS 2, LAST 3, RANK 4), when the file says how its embeddings pool. */
  poolingType?: number;
  tensorCount: number;
  /** Sum of the tensor data sizes from the tensor infos (ggml block sizes, unpadded). */
  tensorBytes: number;
  /** ggml type ids of tensors whose size is unknown to this build (not counted in tensorBytes). */
  unknownTensorTypes: number[];
  /** Bytes of the fixed header and key/values (where the tensor infos start). */
  metadataBytes: number;
  /** Offset of the tensor data: the whole header including tensor infos and padding. */
  headerBytes: number;
  /** The file size when the source told it. */
  fileBytes?: number;
  /** Required keys that were absent (their fields are 0). */
  missingKeys: string[];
  /** Bytes actually fetched or read to produce this summary. */
  bytesRead: number;
  /** The parsed header, with @huggingface/gguf's typed key/values; only with the `keepParsed` option. */
  parsed?: { typedMetadata: GGUFTypedMetadata; tensorInfos: GGUFTensorInfo[] };
}

const DEFAULT_INITIAL_BYTES = 256 * 1024;
const DEFAULT_MAX_HEADER_BYTES = 48 * 1000 * 1000;
const GGUF_MAGIC = [0x47, 0x47, 0x55, 0x46];

/** Reads the GGUF header of a file or URL and summarises it; never reads tensor data. */
export async function readGgufHeader(source: GgufSource, options: ReadGgufHeaderOptions = {}): Promise<GgufHeaderSummary> {
  const initialBytes = Math.max(64, options.initialBytes ?? DEFAULT_INITIAL_BYTES);
  const maxHeaderBytes = options.maxHeaderBytes ?? DEFAULT_MAX_HEADER_BYTES;
  const range = "file" in source ? await openFileRange(source) : httpRange(source);
  try {
    const prefix = new Prefix(range);
    await prefix.ensure(initialBytes);
    checkMagicAndVersion(prefix.bytes, range.label);

    // The library needs an http(s) URL to use the fetch it is given; for a file the URL
    // is a placeholder that never leaves this process.
    const libraryUrl = "url" in source ? source.url : "http://gguf.invalid/file";
    for (;;) {
      let parsed: (GGUFParseOutput & { typedMetadata?: GGUFTypedMetadata }) | undefined;
      let failure: unknown;
      try {
        // Parameters are counted in `summarise`: the library's own count also compares the
        // file size with 1 bit per parameter, a weaker test than `checkTensorLayout`'s.
        parsed = options.keepParsed
          ? await gguf(libraryUrl, { fetch: prefix.libraryFetch, typedMetadata: true })
          : await gguf(libraryUrl, { fetch: prefix.libraryFetch });
      } catch (error) {
        failure = error;
      }
      if (parsed && parsed.tensorInfoByteRange[1] <= prefix.bytes.length) {
        const summary = summarise(parsed, { source: range.label, bytesRead: range.bytesRead, fileBytes: prefix.total });
        return parsed.typedMetadata ? { ...summary, parsed: { typedMetadata: parsed.typedMetadata, tensorInfos: parsed.tensorInfos } } : summary;
      }
      if (prefix.complete) {
        if (parsed) {
          throw new BadRequestError(
            `${range.label} is truncated: its GGUF header claims more key/values or tensors than the file's ${prefix.bytes.length} bytes hold. Fetch the file again.`,
            { code: "gguf_truncated" },
          );
        }
        throw new BadRequestError(`${range.label} has a malformed GGUF header: ${describeError(failure)}. Fetch the file again or pick another file.`, {
          code: "gguf_malformed",
          cause: failure,
        });
      }
      if (prefix.bytes.length >= maxHeaderBytes) {
        throw new BadRequestError(
          `${range.label}: no complete GGUF header in its first ${maxHeaderBytes} bytes${failure === undefined || failure instanceof NeedMoreBytes ? "" : ` (${describeError(failure)})`}. The header is malformed or larger than llmgw reads.`,
          { code: "gguf_malformed", cause: failure },
        );
      }
      await prefix.ensure(Math.min(maxHeaderBytes, prefix.bytes.length * 2));
    }
  } finally {
    await range.close();
  }
}

function checkMagicAndVersion(bytes: Uint8Array, label: string): void {
  const head = bytes.subarray(0, 4);
  if (head.length < 4 || GGUF_MAGIC.some((byte, i) => head[i] !== byte)) {
    const shown = Buffer.from(head)
      .toString("hex")
      .replace(/(..)(?=.)/g, "$1 ");
    throw new BadRequestError(
      `${label} is not a GGUF file: it starts with ${head.length === 0 ? "nothing (empty file)" : `bytes ${shown}`} instead of "GGUF" (47 47 55 46). Check the file name or URL.`,
      { code: "not_gguf" },
    );
  }
  if (bytes.length >= 8) {
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    const little = view.getUint32(4, true);
    const big = view.getUint32(4, false);
    if (!(little >= 1 && little <= 3) && !(big >= 1 && big <= 3)) {
      throw new BadRequestError(`${label} has GGUF version ${little}, which llmgw does not read (versions 1 to 3 exist).`, { code: "gguf_version" });
    }
  }
}

/** Thrown by the library's fetch when the parse needs bytes beyond the prefix. */
class NeedMoreBytes extends Error {}

interface ByteRange {
  label: string;
  bytesRead: number;
  /** The file size, once known. */
  total(): number | undefined;
  /** Bytes [start, end), fewer only at the end of the file. */
  read(start: number, end: number): Promise<Uint8Array>;
  close(): Promise<void>;
}

/** The first bytes of the file, grown on demand, and the fetch the library reads them through. */
class Prefix {
  bytes: Uint8Array = new Uint8Array(0);
  complete = false;
  constructor(private readonly range: ByteRange) {}

  get total(): number | undefined {
    return this.complete ? this.bytes.length : this.range.total();
  }

  async ensure(length: number): Promise<void> {
    if (this.complete || this.bytes.length >= length) return;
    const got = await this.range.read(this.bytes.length, length);
    const wanted = length - this.bytes.length;
    this.bytes = Buffer.concat([this.bytes, got]);
    const total = this.range.total();
    if (got.length < wanted || (total !== undefined && this.bytes.length >= total)) this.complete = true;
  }

  readonly libraryFetch = async (_input: string | URL | Request, init?: RequestInit): Promise<Response> => {
    const header = new Headers(init?.headers).get("range") ?? "";
    const match = /^bytes=(\d+)-(\d+)$/.exec(header);
    if (!match) throw new Error(`unexpected range request "${header}" from the GGUF parser`);
    const start = Number(match[1]);
    const endInclusive = Number(match[2]);
    if (start >= this.bytes.length && !this.complete) throw new NeedMoreBytes();
    let body = this.bytes.subarray(Math.min(start, this.bytes.length), Math.min(endInclusive + 1, this.bytes.length));
    if (!this.complete && body.length < endInclusive + 1 - start) {
      // Fill the rest of the chunk with 0xFF rather than leave the library's zeros: a parse
      // that runs past the real bytes then meets huge string lengths, counts, types and
      // dimensions and fails at once, instead of walking zeros to the end of the chunk.
      const filled = new Uint8Array(endInclusive + 1 - start).fill(0xff);
      filled.set(body);
      body = filled;
    }
    const total = this.total;
    return new Response(body, {
      status: 206,
      headers: { "content-range": `bytes ${start}-${start + body.length - 1}/${total === undefined ? "*" : total}` },
    });
  };
}

async function openFileRange(source: GgufFileSource): Promise<ByteRange> {
  const label = source.file;
  let handle: FileHandle;
  try {
    handle = await open(source.file, "r");
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") {
      throw new NotFoundError(`GGUF file ${label} does not exist.`, { cause: error });
    }
    throw new BadRequestError(`Cannot open GGUF file ${label}: ${describeError(error)}.`, { cause: error });
  }
  const size = (await handle.stat()).size;
  const range: ByteRange = {
    label,
    bytesRead: 0,
    total: () => size,
    async read(start, end) {
      source.signal?.throwIfAborted();
      const length = Math.max(0, Math.min(end, size) - start);
      const buffer = Buffer.alloc(length);
      let filled = 0;
      while (filled < length) {
        const { bytesRead } = await handle.read(buffer, filled, length - filled, start + filled);
        if (bytesRead === 0) break;
        filled += bytesRead;
        range.bytesRead += bytesRead;
      }
      return buffer.subarray(0, filled);
    },
    close: () => handle.close(),
  };
  return range;
}

function httpRange(source: GgufUrlSource): ByteRange {
  const label = withoutQuery(source.url);
  const doFetch: FetchLike =
    source.fetch ??
    ((url, init) =>
      undiciFetch(url, {
        headers: init.headers,
        signal: init.signal,
        ...(source.dispatcher ? { dispatcher: source.dispatcher } : {}),
      }) as Promise<FetchResponseLike>);
  let total: number | undefined;

  const range: ByteRange = {
    label,
    bytesRead: 0,
    total: () => total,
    async read(start, end) {
      try {
        return await readRange(start, end);
      } catch (error) {
        // Classified once, here: a refused connection or a failure mid-body (reset, timeout)
        // may pass on retry; HTTP statuses were classified below.
        if (error instanceof LlmgwError || source.signal?.aborted) throw error;
        throw new UpstreamError(`Reading the GGUF header of ${label} failed: ${describeError(error)}.`, {
          code: "gguf_fetch_failed",
          retryable: true,
          cause: error,
        });
      }
    },
    close: async () => {},
  };

  async function readRange(start: number, end: number): Promise<Uint8Array> {
    if (total !== undefined && start >= total) return new Uint8Array(0);
    const response = await doFetch(source.url, {
      // Offsets are in the stored bytes, so ask for them uncompressed.
      headers: { "accept-encoding": "identity", ...source.headers, range: `bytes=${start}-${end - 1}` },
      ...(source.signal ? { signal: source.signal } : {}),
    });
    if (response.status === 206) {
      const contentRange = /^bytes (\d+)-\d+\/(\d+|\*)$/.exec(response.headers.get("content-range") ?? "");
      if (contentRange?.[2] !== undefined && contentRange[2] !== "*") total = Number(contentRange[2]);
      if (contentRange && Number(contentRange[1]) !== start) {
        await response.body?.cancel();
        throw new UpstreamError(`${label} answered a range request for byte ${start} with bytes from ${contentRange[1]}.`, { code: "gguf_fetch_failed" });
      }
      return readBody(response, range, 0, end - start);
    }
    if (response.status === 200) {
      // The server ignores Range and sends the whole file: take what is needed, then hang up.
      const length = Number(response.headers.get("content-length"));
      if (Number.isSafeInteger(length) && length >= 0) total = length;
      return readBody(response, range, start, end - start);
    }
    if (response.status === 416) {
      const unsatisfied = /\/(\d+)$/.exec(response.headers.get("content-range") ?? "");
      if (unsatisfied?.[1] !== undefined) total = Number(unsatisfied[1]);
      await response.body?.cancel();
      return new Uint8Array(0);
    }
    await response.body?.cancel();
    const status = response.status;
    throw new UpstreamError(`Reading the GGUF header of ${label} failed: HTTP ${status}${status === 404 ? " (no such file)" : ""}.`, {
      code: "gguf_fetch_failed",
      retryable: status === 408 || status === 429 || status >= 500,
    });
  }
  return range;
}

/** Reads `length` bytes after skipping `skip`, counting every byte received, then cancels the rest. */
async function readBody(response: FetchResponseLike, range: ByteRange, skip: number, length: number): Promise<Uint8Array> {
  if (!response.body) return new Uint8Array(0);
  const reader = response.body.getReader();
  const parts: Uint8Array[] = [];
  let position = 0;
  let kept = 0;
  try {
    while (kept < length) {
      const { done, value } = await reader.read();
      if (done) break;
      range.bytesRead += value.length;
      const from = Math.max(0, skip - position);
      position += value.length;
      if (from >= value.length) continue;
      const part = value.subarray(from, Math.min(value.length, from + length - kept));
      parts.push(part);
      kept += part.length;
    }
  } finally {
    await reader.cancel().catch(() => {});
  }
  return Buffer.concat(parts);
}

function withoutQuery(url: string): string {
  try {
    const parsed = new URL(url);
    return `${parsed.origin}${parsed.pathname}`;
  } catch {
    return url;
  }
}

type Metadata = Record<string, MetadataValue | undefined>;

/** ggml's default when `general.alignment` is absent (GGUF_DEFAULT_ALIGNMENT). */
const DEFAULT_ALIGNMENT = 32;

/**
 * Refuses tensor infos that put data where llama.cpp will not find it. Two rules of the
 * bundled llama.cpp (v0.4.0): ggml's reader (ggml/src/gguf.cpp) requires each tensor's
 * offset, counted from the start of the data section, to be the running sum of the sizes
 * of the tensors before it, each padded to `general.alignment`; and the model loader
 * (src/llama-model-loader.h) refuses a tensor whose data ends past the end of the file
 * ("data is not within the file bounds, model is corrupted or incomplete"). The last
 * tensor's padding need not be in the file. Tensors of a type this build cannot size end
 * the offset rule there (the next expected offset is unknown) and are left out of the
 * bounds rule. Without a known file size (an HTTP server that told none) only the offsets
 * are checked.
 */
function checkTensorLayout(parsed: GGUFParseOutput, meta: Metadata, context: { source: string; fileBytes: number | undefined }): void {
  const declared = numberOf(meta["general.alignment"]);
  // ggml refuses an alignment that is not a power of two; the parse would have failed on it.
  const alignment = declared !== undefined && declared > 0 && Number.isInteger(Math.log2(declared)) ? declared : DEFAULT_ALIGNMENT;
  const dataStart = Number(parsed.tensorDataOffset);
  let expectedOffset: number | undefined = 0;
  let furthest: { name: string; end: number } | undefined;
  for (const tensor of parsed.tensorInfos) {
    const offset = Number(tensor.offset);
    if (expectedOffset !== undefined && offset !== expectedOffset) {
      throw new BadRequestError(
        `${context.source} has a malformed GGUF header: tensor '${tensor.name}' starts at byte ${offset} of the data section, where ggml expects byte ${expectedOffset} ` +
          `(the sizes of the tensors before it, each padded to ${alignment} bytes), so llama.cpp refuses the file. Re-create the file or fetch it again.`,
        { code: "gguf_malformed" },
      );
    }
    const elements = tensor.shape.reduce((product, dim) => product * Number(dim), 1);
    const bytes = ggmlTensorBytes(tensor.dtype, elements);
    if (bytes === undefined) {
      expectedOffset = undefined;
      continue;
    }
    if (expectedOffset !== undefined) expectedOffset += Math.ceil(bytes / alignment) * alignment;
    const end = dataStart + offset + bytes;
    if (furthest === undefined || end > furthest.end) furthest = { name: tensor.name, end };
  }
  if (furthest !== undefined && context.fileBytes !== undefined && furthest.end > context.fileBytes) {
    const missing = furthest.end - context.fileBytes;
    throw new BadRequestError(
      `${context.source} is truncated: its tensor data ends at byte ${furthest.end} (tensor '${furthest.name}'), but the file has only ${context.fileBytes} bytes ` +
        `(${formatBytes(missing)} missing), so llama.cpp cannot load it. The copy or download was cut short: copy or fetch the file again.`,
      { code: "gguf_truncated" },
    );
  }
}

function numberOf(value: MetadataValue | undefined): number | undefined {
  if (typeof value === "number") return value;
  if (typeof value === "bigint") return Number(value);
  return undefined;
}

/** A scalar, or the largest element of a per-layer array. */
function scalarOrArray(value: MetadataValue | undefined): { value?: number; perLayer?: number[] } {
  if (Array.isArray(value)) {
    const perLayer = value.map((item) => numberOf(item as MetadataValue) ?? 0);
    return perLayer.length === 0 ? {} : { value: Math.max(...perLayer), perLayer };
  }
  const scalar = numberOf(value);
  return scalar === undefined ? {} : { value: scalar };
}

// llama.cpp sets this bit in general.file_type when it guessed the type (LLAMA_FTYPE_GUESSED).
const FTYPE_GUESSED = 1024;

function summarise(parsed: GGUFParseOutput, context: { source: string; bytesRead: number; fileBytes: number | undefined }): GgufHeaderSummary {
  const meta = parsed.metadata as unknown as Metadata;
  const architecture = meta["general.architecture"];
  if (typeof architecture !== "string" || architecture === "") {
    throw new BadRequestError(`${context.source} has no general.architecture key, so llmgw cannot tell what model it holds.`, {
      code: "gguf_malformed",
    });
  }
  const key = (suffix: string) => meta[`${architecture}.${suffix}`];
  const missingKeys: string[] = [];
  const required = (suffix: string): number => {
    const value = numberOf(key(suffix));
    if (value === undefined) missingKeys.push(`${architecture}.${suffix}`);
    return value ?? 0;
  };

  const contextLength = required("context_length");
  const embeddingLength = required("embedding_length");
  const blockCount = required("block_count");
  const heads = scalarOrArray(key("attention.head_count"));
  const kvHeads = scalarOrArray(key("attention.head_count_kv"));
  const headCount = heads.value ?? 0;
  const headCountKv = kvHeads.value ?? headCount;
  // llama.cpp divides by the first layer's head count for the default head size.
  const firstHeads = heads.perLayer?.find((n) => n > 0) ?? headCount;
  const defaultHeadSize = firstHeads > 0 ? embeddingLength / firstHeads : 0;

  let tensorBytes = 0;
  let parameterCount = 0;
  const unknownTensorTypes = new Set<number>();
  const bytesByType = new Map<number, number>();
  for (const tensor of parsed.tensorInfos) {
    const elements = tensor.shape.reduce((product, dim) => product * Number(dim), 1);
    parameterCount += elements;
    const bytes = ggmlTensorBytes(tensor.dtype, elements);
    if (bytes === undefined) {
      unknownTensorTypes.add(tensor.dtype);
      continue;
    }
    tensorBytes += bytes;
    if (tensor.n_dims >= 2) bytesByType.set(tensor.dtype, (bytesByType.get(tensor.dtype) ?? 0) + bytes);
  }

  checkTensorLayout(parsed, meta, context);

  const rawFileType = numberOf(meta["general.file_type"]);
  const fileType = rawFileType === undefined ? undefined : rawFileType & ~FTYPE_GUESSED;
  const fileTypeName = fileType === undefined ? undefined : (GGMLFileQuantizationType as unknown as Record<number, string>)[fileType];
  let quantisation: string;
  let quantisationFrom: GgufHeaderSummary["quantisationFrom"];
  if (fileTypeName !== undefined) {
    quantisation = fileTypeName;
    quantisationFrom = "general.file_type";
  } else {
    const dominant = [...bytesByType.entries()].sort((a, b) => b[1] - a[1])[0]?.[0];
    quantisation = dominant === undefined ? "unknown" : ((GGMLQuantizationType as unknown as Record<number, string>)[dominant] ?? `type ${dominant}`);
    quantisationFrom = "tensor types";
  }

  const tokens = meta["tokenizer.ggml.tokens"];
  const vocabSize = Array.isArray(tokens) ? tokens.length : (numberOf(key("vocab_size")) ?? numberOf(meta["general.vocab_size"]));
  const splitNo = numberOf(meta["split.no"]);
  const splitCount = numberOf(meta["split.count"]);
  const name = meta["general.name"];
  const feedForward = scalarOrArray(key("feed_forward_length")).value;
  const poolingType = numberOf(key("pooling_type"));

  return {
    source: context.source,
    ggufVersion: parsed.metadata.version,
    architecture,
    ...(typeof name === "string" ? { name } : {}),
    parameterCount,
    ...(fileType === undefined ? {} : { fileType }),
    quantisation,
    quantisationFrom,
    contextLength,
    embeddingLength,
    blockCount,
    ...(feedForward === undefined ? {} : { feedForwardLength: feedForward }),
    headCount,
    headCountKv,
    ...(kvHeads.perLayer ? { headCountKvPerLayer: kvHeads.perLayer } : {}),
    keyLength: numberOf(key("attention.key_length")) ?? defaultHeadSize,
    valueLength: numberOf(key("attention.value_length")) ?? defaultHeadSize,
    ...(vocabSize === undefined ? {} : { vocabSize }),
    ...(splitNo !== undefined && splitCount !== undefined ? { split: { no: splitNo, count: splitCount } } : {}),
    chatTemplate: typeof meta["tokenizer.chat_template"] === "string",
    ...(poolingType === undefined ? {} : { poolingType }),
    tensorCount: parsed.tensorInfos.length,
    tensorBytes,
    unknownTensorTypes: [...unknownTensorTypes].sort((a, b) => a - b),
    metadataBytes: parsed.tensorInfoByteRange[0],
    headerBytes: Number(parsed.tensorDataOffset),
    ...(context.fileBytes === undefined ? {} : { fileBytes: context.fileBytes }),
    missingKeys,
    bytesRead: context.bytesRead,
  };
}
