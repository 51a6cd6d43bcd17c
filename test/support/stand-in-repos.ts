// Repositories for the stand-in hub, shaped like real ones on the Hugging Face Hub:
//
// - `llmgw-test/tiny-llama-GGUF`: one GGUF per quantisation (Q4_K_M, Q8_0, F16) at the root,
//   a split Q2_K set in a folder (`Q2_K/…-00001-of-00002.gguf`, as Unsloth lays out large
//   quants), a vision projector (`mmproj-…-F16.gguf`), an importance matrix, README and
//   .gitattributes; a `v1.0` tag on an older commit that had only the Q8_0 file.
// - `llmgw-test/tiny-llama`: a transformers-layout safetensors repository: config.json with
//   the shape fields, two shards with valid safetensors headers and their
//   model.safetensors.index.json, tokenizer files, generation config.
// - `llmgw-test/gated-llama-GGUF`: gated ("manual") with one approved token.
// - `llmgw-test/private-llama-GGUF`: private, visible to one token only.
//
// The GGUF files are tiny llama models from src/gguf/tiny-model.ts that llama.cpp loads;
// the quantisation is only in the name and `general.file_type` (the tensors stay F32).
// Each part of the split set is a whole tiny model carrying `split.no`/`split.count`
// metadata: right for registry and mirror tests, not a split llama.cpp would load. The
// projector and the importance matrix are tiny models too, with other metadata.
//
// For local sources (a folder on the server's disk) `makeUnreadableFile` stands for a
// weights file the server may not read.
import { chmod, mkdtemp, open, readFile, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { GGUFValueType } from "@huggingface/gguf";
import { writeTinyLlamaGguf, type TypedMetadataValue } from "../../src/gguf/tiny-model.ts";
import { fakeCommitSha, type StandInFile, type StandInRepo } from "./stand-in-hub.ts";

export const STAND_IN_OWNER = "llmgw-test";
export const GGUF_REPO = `${STAND_IN_OWNER}/tiny-llama-GGUF`;
export const SAFETENSORS_REPO = `${STAND_IN_OWNER}/tiny-llama`;
export const GATED_REPO = `${STAND_IN_OWNER}/gated-llama-GGUF`;
export const PRIVATE_REPO = `${STAND_IN_OWNER}/private-llama-GGUF`;
/** The token the gated and private repositories approve. */
export const APPROVED_TOKEN = "hf_stand_in_approved";

export interface StandInRepos {
  gguf: StandInRepo;
  safetensors: StandInRepo;
  gated: StandInRepo;
  private: StandInRepo;
  all: StandInRepo[];
}

// llama.cpp's llama_ftype numbers for general.file_type.
const FILE_TYPE: Record<string, number> = { F32: 0, F16: 1, Q8_0: 7, Q2_K: 10, Q4_K_M: 15 };

/**
 * The bytes of one stand-in GGUF file. This is the one place that makes GGUF content, so
 * switching to other content is a one-line change.
 */
export async function tinyGgufBytes(options: { seed: number; extraMetadata?: Record<string, TypedMetadataValue> }): Promise<Buffer> {
  const dir = await mkdtemp(join(tmpdir(), "llmgw-stand-in-"));
  try {
    const path = join(dir, "model.gguf");
    await writeTinyLlamaGguf({ path, seed: options.seed, ...(options.extraMetadata === undefined ? {} : { extraMetadata: options.extraMetadata }) });
    return await readFile(path);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

function u32(value: number): TypedMetadataValue {
  return { value, type: GGUFValueType.UINT32 };
}

function u16(value: number): TypedMetadataValue {
  return { value, type: GGUFValueType.UINT16 };
}

function str(value: string): TypedMetadataValue {
  return { value, type: GGUFValueType.STRING };
}

async function quantFile(path: string, quant: string, seed: number, extra: Record<string, TypedMetadataValue> = {}): Promise<StandInFile> {
  const fileType = FILE_TYPE[quant] ?? 0;
  return { path, content: await tinyGgufBytes({ seed, extraMetadata: { "general.file_type": u32(fileType), ...extra } }) };
}

function text(path: string, content: string): StandInFile {
  return { path, content: Buffer.from(content) };
}

function json(path: string, value: unknown): StandInFile {
  return text(path, `${JSON.stringify(value, null, 2)}\n`);
}

const GITATTRIBUTES = [
  "*.gguf filter=lfs diff=lfs merge=lfs -text",
  "*.safetensors filter=lfs diff=lfs merge=lfs -text",
  "*.model filter=lfs diff=lfs merge=lfs -text",
  "",
].join("\n");

export interface SafetensorsTensor {
  name: string;
  dtype: "F16" | "BF16" | "F32";
  shape: number[];
}

/**
 * A valid safetensors file: an 8-byte little-endian header length, the JSON header
 * (`__metadata__` plus `{dtype, shape, data_offsets}` per tensor, padded with spaces to a
 * multiple of 8 as the reference implementation does), then the tensor bytes.
 */
export function safetensorsBytes(tensors: SafetensorsTensor[], seed = 1): Buffer {
  const width = { F16: 2, BF16: 2, F32: 4 } as const;
  const header: Record<string, unknown> = { __metadata__: { format: "pt" } };
  let offset = 0;
  for (const tensor of tensors) {
    const bytes = tensor.shape.reduce((product, n) => product * n, 1) * width[tensor.dtype];
    header[tensor.name] = { dtype: tensor.dtype, shape: tensor.shape, data_offsets: [offset, offset + bytes] };
    offset += bytes;
  }
  let headerText = JSON.stringify(header);
  headerText += " ".repeat((8 - (Buffer.byteLength(headerText) % 8)) % 8);
  const headerBytes = Buffer.from(headerText);
  const length = Buffer.alloc(8);
  length.writeBigUInt64LE(BigInt(headerBytes.length));
  const data = Buffer.alloc(offset);
  // Small deterministic noise; the values do not matter, the sizes and layout do.
  let state = seed >>> 0 || 1;
  for (let i = 0; i < data.length; i += 2) {
    state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
    data.writeUInt16LE(0x2c00 | (state >>> 22), i); // F16 values around 0.06
  }
  return Buffer.concat([length, headerBytes, data]);
}

/** The tensor byte count of a safetensors file, i.e. what `metadata.total_size` adds up. */
function tensorBytes(file: Buffer): number {
  const headerLength = Number(file.readBigUInt64LE(0));
  return file.length - 8 - headerLength;
}

async function ggufRepoFiles(name: string): Promise<{ latest: StandInFile[]; old: StandInFile[] }> {
  const base = "tiny-llama";
  const q8 = await quantFile(`${base}-Q8_0.gguf`, "Q8_0", 2);
  const latest: StandInFile[] = [
    text(".gitattributes", GITATTRIBUTES),
    text("README.md", `# ${name}\n\nTiny llama GGUF files for llmgw tests.\n`),
    await quantFile(`${base}-Q4_K_M.gguf`, "Q4_K_M", 1),
    q8,
    await quantFile(`${base}-F16.gguf`, "F16", 3),
    await quantFile(`Q2_K/${base}-Q2_K-00001-of-00002.gguf`, "Q2_K", 4, { "split.no": u16(0), "split.count": u16(2) }),
    await quantFile(`Q2_K/${base}-Q2_K-00002-of-00002.gguf`, "Q2_K", 5, { "split.no": u16(1), "split.count": u16(2) }),
    await quantFile(`mmproj-${base}-F16.gguf`, "F16", 6, { "general.architecture": str("clip") }),
    await quantFile("imatrix_unsloth.gguf", "F32", 7, { "general.type": str("imatrix") }),
  ];
  const old: StandInFile[] = [text(".gitattributes", GITATTRIBUTES), text("README.md", `# ${name}\n`), q8];
  return { latest, old };
}

function safetensorsRepoFiles(): StandInFile[] {
  const hidden = 64;
  const heads = 4;
  const kvHeads = 2;
  const layers = 2;
  const intermediate = 128;
  const vocab = 32;
  const headDim = hidden / heads;
  const layer = (n: number): SafetensorsTensor[] => [
    { name: `model.layers.${n}.input_layernorm.weight`, dtype: "F16", shape: [hidden] },
    { name: `model.layers.${n}.self_attn.q_proj.weight`, dtype: "F16", shape: [heads * headDim, hidden] },
    { name: `model.layers.${n}.self_attn.k_proj.weight`, dtype: "F16", shape: [kvHeads * headDim, hidden] },
    { name: `model.layers.${n}.self_attn.v_proj.weight`, dtype: "F16", shape: [kvHeads * headDim, hidden] },
    { name: `model.layers.${n}.self_attn.o_proj.weight`, dtype: "F16", shape: [hidden, heads * headDim] },
    { name: `model.layers.${n}.post_attention_layernorm.weight`, dtype: "F16", shape: [hidden] },
    { name: `model.layers.${n}.mlp.gate_proj.weight`, dtype: "F16", shape: [intermediate, hidden] },
    { name: `model.layers.${n}.mlp.up_proj.weight`, dtype: "F16", shape: [intermediate, hidden] },
    { name: `model.layers.${n}.mlp.down_proj.weight`, dtype: "F16", shape: [hidden, intermediate] },
  ];
  const shard1: SafetensorsTensor[] = [{ name: "model.embed_tokens.weight", dtype: "F16", shape: [vocab, hidden] }, ...layer(0)];
  const shard2: SafetensorsTensor[] = [
    ...layer(1),
    { name: "model.norm.weight", dtype: "F16", shape: [hidden] },
    { name: "lm_head.weight", dtype: "F16", shape: [vocab, hidden] },
  ];
  const names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"] as const;
  const bytes = [safetensorsBytes(shard1, 1), safetensorsBytes(shard2, 2)];
  const weightMap: Record<string, string> = {};
  for (const tensor of shard1) weightMap[tensor.name] = names[0];
  for (const tensor of shard2) weightMap[tensor.name] = names[1];
  const tokens = ["<unk>", "<s>", "</s>", ...Array.from({ length: vocab - 3 }, (_, i) => `t${i}`)];
  return [
    text(".gitattributes", GITATTRIBUTES),
    text("README.md", "# tiny-llama\n\nA tiny llama in safetensors for llmgw tests.\n"),
    json("config.json", {
      architectures: ["LlamaForCausalLM"],
      model_type: "llama",
      hidden_size: hidden,
      intermediate_size: intermediate,
      num_hidden_layers: layers,
      num_attention_heads: heads,
      num_key_value_heads: kvHeads,
      head_dim: headDim,
      max_position_embeddings: 2048,
      rms_norm_eps: 1e-5,
      vocab_size: vocab,
      bos_token_id: 1,
      eos_token_id: 2,
      torch_dtype: "float16",
      tie_word_embeddings: false,
    }),
    json("generation_config.json", { bos_token_id: 1, eos_token_id: 2, do_sample: false }),
    json("model.safetensors.index.json", {
      metadata: { total_size: tensorBytes(bytes[0] as Buffer) + tensorBytes(bytes[1] as Buffer) },
      weight_map: weightMap,
    }),
    { path: names[0], content: bytes[0] as Buffer },
    { path: names[1], content: bytes[1] as Buffer },
    json("special_tokens_map.json", { bos_token: "<s>", eos_token: "</s>", unk_token: "<unk>" }),
    json("tokenizer.json", {
      version: "1.0",
      truncation: null,
      padding: null,
      added_tokens: [],
      normalizer: null,
      pre_tokenizer: { type: "Whitespace" },
      post_processor: null,
      decoder: null,
      model: { type: "WordLevel", vocab: Object.fromEntries(tokens.map((token, id) => [token, id])), unk_token: "<unk>" },
    }),
    json("tokenizer_config.json", {
      bos_token: "<s>",
      eos_token: "</s>",
      unk_token: "<unk>",
      model_max_length: 2048,
      tokenizer_class: "PreTrainedTokenizerFast",
      chat_template: "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}",
    }),
  ];
}

/** Builds the stand-in repositories (about 5 MB of tiny GGUF files, generated in well under a second). */
export async function buildStandInRepos(): Promise<StandInRepos> {
  const ggufFiles = await ggufRepoFiles(GGUF_REPO);
  const oldSha = fakeCommitSha(`${GGUF_REPO}@v1.0`);
  const gguf: StandInRepo = {
    name: GGUF_REPO,
    revisions: { main: fakeCommitSha(GGUF_REPO), "v1.0": oldSha },
    filesAt: { [oldSha]: ggufFiles.old },
    files: ggufFiles.latest,
  };
  const safetensors: StandInRepo = { name: SAFETENSORS_REPO, files: safetensorsRepoFiles() };
  const small = ggufFiles.latest.filter((file) => !file.path.startsWith("Q2_K/"));
  const gated: StandInRepo = { name: GATED_REPO, gated: "manual", approvedTokens: [APPROVED_TOKEN], files: small };
  const privateRepo: StandInRepo = { name: PRIVATE_REPO, private: true, approvedTokens: [APPROVED_TOKEN], files: small };
  return { gguf, safetensors, gated, private: privateRepo, all: [gguf, safetensors, gated, privateRepo] };
}

// Write-only kernel files (mode 0200): open(2) for reading fails with EACCES even for
// root, whom file modes do not stop. The sysfs one has a size (4096), the /proc/sys one 0.
const WRITE_ONLY_FILES = ["/sys/bus/pci/rescan", "/proc/sys/vm/compact_memory"];

/**
 * Makes `path` a file this process cannot read, standing for a weights file with the wrong
 * owner or mode in a local source: a file with mode 000 for an ordinary user; for root, a
 * symbolic link to a write-only kernel file (never written to). Resolves false when
 * neither is possible here (the caller skips the check).
 */
export async function makeUnreadableFile(path: string): Promise<boolean> {
  if (process.getuid?.() !== 0) {
    await writeFile(path, "weights nobody may read");
    await chmod(path, 0o000);
    return true;
  }
  for (const candidate of WRITE_ONLY_FILES) {
    // open(2), not access(2): access lets root pass where open still refuses.
    try {
      await (await open(candidate, "r")).close();
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "EACCES") continue;
      await symlink(candidate, path);
      return true;
    }
  }
  return false;
}
