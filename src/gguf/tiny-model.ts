// Generator of tiny llama GGUF models that the bundled llama.cpp (node-llama-cpp) loads
// and runs in milliseconds on a couple of CPU cores. Tests, `llmgw up --demo` and
// stand-in repository files use it, so nothing ever downloads a real model. The weights
// are random (a seeded PRNG, so one seed always gives the same bytes); the vocabulary is
// a real SentencePiece-style one (every byte token, ChatML control tokens, ASCII letters
// and some words) so text tokenises sensibly and chat generation can end on `<|im_end|>`.
//
// Key rules come from llama.cpp's loader (see shared/reference/protocols.md §2): hparams
// are UINT32 and the RMS epsilon FLOAT32 because llama.cpp rejects other key types, and
// there are no tensors beyond what the `llama` architecture expects. The file layout
// (alignment, offsets) is ./gguf-writer.ts's.
import { GGUFValueType, GGUF_ALIGNMENT, createPrng, fillUniform, writeGguf, type GgufTensor, type TypedMetadataValue } from "./gguf-writer.ts";

// Tests, stand-in repositories and benchmarks import these from here.
export { GGUFValueType, type TypedMetadataValue };

export interface TinyLlamaOptions {
  /** Where to write the file (overwritten if present). */
  path: string;
  /** Seed of the weight PRNG; the same seed and shape give the same bytes. Default 1. */
  seed?: number;
  /** n_embd. Default 64. */
  embeddingLength?: number;
  /** block_count. Default 2. */
  layers?: number;
  /** attention.head_count. Default 4 (must divide embeddingLength). */
  heads?: number;
  /** attention.head_count_kv. Default = heads (must divide heads). */
  kvHeads?: number;
  /** feed_forward_length. Default 2 × embeddingLength. */
  feedForwardLength?: number;
  /** llama.context_length (the trained context). Default 4096. */
  contextLength?: number;
  /** general.name. Default "llmgw tiny llama". */
  name?: string;
  /**
   * Never end a generation on its own: the output projection gives the control tokens
   * (`</s>`, `<|im_end|>`, ...) a logit of 0, which greedy decoding never picks over the
   * hundreds of random positive logits. For tests of cancellation and limits, which need
   * a generation that runs until it is stopped. Default false: the random model then ends
   * a reply with `<|im_end|>` now and then, like a real one.
   */
  endless?: boolean;
  /**
   * Makes the reply a script: greedy decoding (and, nearly always, sampling) emits these
   * vocabulary tokens in this order, over and over, whatever the prompt. Items are token
   * strings as the vocabulary spells them ("▁say", "<0xE2>", "<|im_end|>"), each at most
   * once. For tests that need to know the exact tokens of a reply, such as a multi-byte
   * character spread over byte tokens. The layers then add nothing to the residual stream
   * (zero output projections), each script token has its own embedding axis and every
   * other token a shared one, and the output projection maps each axis to the token that
   * follows; so embeddingLength must exceed the script's length. Overrides `endless`.
   */
  replyScript?: string[];
  /**
   * Text only: the model never emits a byte token that is not printable ASCII (no lone UTF-8
   * continuation bytes, no control characters) nor a control token other than `<|im_end|>`,
   * so every reply is valid UTF-8 text whatever the prompt. llama-server's chat parser refuses
   * a reply with invalid UTF-8 ("does not match the expected peg-native format"), which the
   * random model's byte tokens produce; real models write text. The reply still depends on
   * the whole input (unlike `replyScript`), for tests where an adapter or an image must change
   * it. How: embedding axis 0 holds a constant for every token and no layer writes to it, so
   * after the final norm it is always positive, and the banned tokens' output rows weigh it
   * strongly negative. Ignored with `replyScript`.
   */
  textOnly?: boolean;
  /**
   * More typed key/values, added to (or replacing) the generated ones: for example
   * `general.file_type` or `split.no` for stand-in repository files.
   */
  extraMetadata?: Record<string, TypedMetadataValue>;
}

export interface TinyLlamaInfo {
  path: string;
  /** File size in bytes. */
  bytes: number;
  /** Number of weights over all tensors. */
  parameterCount: number;
  vocabSize: number;
  tensorCount: number;
  /** Special token ids, for tests that need them. */
  tokens: { unk: number; bos: number; eos: number; imStart: number; imEnd: number };
}

/** ChatML, the template `tokenizer.chat_template` carries (Qwen/Hermes style). */
export const TINY_CHAT_TEMPLATE =
  "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}" +
  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

// SentencePiece token types (llama.cpp llama_token_type).
const TYPE_NORMAL = 1;
const TYPE_UNKNOWN = 2;
const TYPE_CONTROL = 3;
const TYPE_BYTE = 6;

// Words whose every prefix becomes a token, with and without SentencePiece's "▁" (space)
// marker: SPM merges adjacent pieces pairwise, so a word is one token only if each step of
// the merge path exists. The bare forms serve text right after a special token (a role
// after `<|im_start|>`, a prompt after BOS), where no space marker is added.
const WORDS = [
  "the",
  "a",
  "an",
  "and",
  "to",
  "of",
  "is",
  "are",
  "you",
  "I",
  "it",
  "in",
  "that",
  "this",
  "for",
  "with",
  "on",
  "hello",
  "hi",
  "world",
  "say",
  "one",
  "sentence",
  "how",
  "what",
  "model",
  "test",
  "tiny",
  "llama",
  "answer",
  "user",
  "assistant",
  "system",
  "yes",
  "no",
  "good",
  "day",
  "thank",
  "please",
  "count",
];

interface Vocab {
  tokens: string[];
  scores: number[];
  types: number[];
  ids: TinyLlamaInfo["tokens"];
}

function buildVocab(): Vocab {
  const tokens: string[] = [];
  const scores: number[] = [];
  const types: number[] = [];
  const seen = new Set<string>();
  const add = (text: string, type: number, score: number): number => {
    // llama.cpp asserts that token strings are unique.
    if (seen.has(text)) return tokens.indexOf(text);
    seen.add(text);
    tokens.push(text);
    scores.push(score);
    types.push(type);
    return tokens.length - 1;
  };
  const unk = add("<unk>", TYPE_UNKNOWN, 0);
  const bos = add("<s>", TYPE_CONTROL, 0);
  // Kept at SentencePiece's usual id 2, though `<|im_end|>` is the eos this model declares.
  add("</s>", TYPE_CONTROL, 0);
  // Byte fallback looks tokens up as "<0xXX>" (upper-case hex) and throws when one is missing.
  for (let byte = 0; byte < 256; byte++) add(`<0x${byte.toString(16).toUpperCase().padStart(2, "0")}>`, TYPE_BYTE, 0);
  const imStart = add("<|im_start|>", TYPE_CONTROL, 0);
  const imEnd = add("<|im_end|>", TYPE_CONTROL, 0);

  // Ordinary pieces; earlier ones score higher, as in SentencePiece vocabularies.
  let rank = 0;
  const normal = (text: string) => add(text, TYPE_NORMAL, -rank++);
  normal("▁");
  for (const word of WORDS) {
    const piece = `▁${word}`;
    for (let end = 2; end <= piece.length; end++) normal(piece.slice(0, end));
  }
  for (const word of WORDS) for (let end = 2; end <= word.length; end++) normal(word.slice(0, end));
  const singles = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'-:;\"()";
  for (const char of singles) normal(char);
  for (const char of singles) normal(`▁${char}`);
  return { tokens, scores, types, ids: { unk, bos, eos: imEnd, imStart, imEnd } };
}

interface TensorPlan {
  name: string;
  /** ggml order: dims[0] is the contiguous dimension. */
  dims: number[];
  /** "ones" for norm weights, otherwise uniform(-scale, scale). */
  init: "ones" | { scale: number };
}

function planTensors(shape: { embd: number; layers: number; heads: number; kvHeads: number; ff: number; vocab: number }): TensorPlan[] {
  const { embd, layers, heads, kvHeads, ff, vocab } = shape;
  const headDim = embd / heads;
  // Uniform(-a, a) with a = sqrt(3 / fan_in) keeps activations at unit variance.
  const linear = (fanIn: number) => ({ scale: Math.sqrt(3 / fanIn) });
  const plan: TensorPlan[] = [
    { name: "token_embd.weight", dims: [embd, vocab], init: { scale: 1 } },
    { name: "output_norm.weight", dims: [embd], init: "ones" },
    // A larger scale than unit variance makes the output distribution peaked, so sampled
    // text from the random model is less uniform noise.
    { name: "output.weight", dims: [embd, vocab], init: { scale: 4 * Math.sqrt(3 / embd) } },
  ];
  for (let layer = 0; layer < layers; layer++) {
    const p = `blk.${layer}.`;
    plan.push(
      { name: `${p}attn_norm.weight`, dims: [embd], init: "ones" },
      { name: `${p}attn_q.weight`, dims: [embd, heads * headDim], init: linear(embd) },
      { name: `${p}attn_k.weight`, dims: [embd, kvHeads * headDim], init: linear(embd) },
      { name: `${p}attn_v.weight`, dims: [embd, kvHeads * headDim], init: linear(embd) },
      { name: `${p}attn_output.weight`, dims: [heads * headDim, embd], init: linear(heads * headDim) },
      { name: `${p}ffn_norm.weight`, dims: [embd], init: "ones" },
      { name: `${p}ffn_gate.weight`, dims: [embd, ff], init: linear(embd) },
      { name: `${p}ffn_down.weight`, dims: [ff, embd], init: linear(ff) },
      { name: `${p}ffn_up.weight`, dims: [embd, ff], init: linear(embd) },
    );
  }
  return plan;
}

/** A reply script as token ids, with the embedding axis of each token (0: every token outside the script). */
interface ScriptAxes {
  ids: number[];
  axisOf: Map<number, number>;
  vocabSize: number;
}

function scriptAxes(script: string[], vocab: Vocab, embd: number): ScriptAxes {
  if (script.length === 0) throw new RangeError("writeTinyLlamaGguf: replyScript needs at least one token.");
  if (script.length >= embd)
    throw new RangeError(`writeTinyLlamaGguf: replyScript has ${script.length} tokens; embeddingLength must be larger (it is ${embd}).`);
  const ids = script.map((text) => {
    const id = vocab.tokens.indexOf(text);
    if (id < 0) throw new RangeError(`writeTinyLlamaGguf: replyScript token ${JSON.stringify(text)} is not in the vocabulary.`);
    return id;
  });
  if (new Set(ids).size !== ids.length) throw new RangeError("writeTinyLlamaGguf: replyScript names a token twice; each may appear once.");
  return { ids, axisOf: new Map(ids.map((id, index) => [id, index + 1])), vocabSize: vocab.tokens.length };
}

// The logit of the scripted next token (after the final RMS norm, which scales a one-hot
// vector to sqrt(embd)); every other logit is 0, so even sampling at temperature 2 keeps
// to the script.
const SCRIPT_LOGIT = 40;

/** Overwrites a tensor's random values so the model follows the reply script. */
function scriptTensor(name: string, values: Float32Array, embd: number, script: ScriptAxes): void {
  if (name.endsWith("attn_output.weight") || name.endsWith("ffn_down.weight")) {
    // The layers leave the residual stream as it is: the hidden state is the token's embedding.
    values.fill(0);
  } else if (name === "token_embd.weight") {
    values.fill(0);
    for (let id = 0; id < script.vocabSize; id++) values[id * embd + (script.axisOf.get(id) ?? 0)] = 1;
  } else if (name === "output.weight") {
    values.fill(0);
    const weight = SCRIPT_LOGIT / Math.sqrt(embd);
    for (const [index, id] of script.ids.entries()) {
      const previous = script.ids[(index + script.ids.length - 1) % script.ids.length] as number;
      values[id * embd + (script.axisOf.get(previous) ?? 0)] = weight;
    }
    // Any token outside the script (the prompt's last one) leads to the script's start.
    values[(script.ids[0] as number) * embd] = weight;
  }
}

// textOnly: the constant on axis 0 of every embedding, and how strongly a banned token's
// output row weighs it. After the final RMS norm axis 0 is about CONSTANT / rms (2–4 here),
// so a banned logit sits near -BAN × that, far below the allowed logits (spread about ±10).
const TEXT_ONLY_CONSTANT = 4;
const TEXT_ONLY_BAN = 40;

/** Tokens a textOnly model never emits: bytes that are not printable ASCII (tab and newline stay), control tokens but `<|im_end|>`. */
function bannedForText(vocab: Vocab): Set<number> {
  const banned = new Set<number>();
  for (const [id, type] of vocab.types.entries()) {
    if ((type === TYPE_CONTROL || type === TYPE_UNKNOWN) && id !== vocab.ids.imEnd) banned.add(id);
    if (type === TYPE_BYTE) {
      const byte = Number.parseInt((vocab.tokens[id] as string).slice(3, 5), 16);
      if (byte >= 0x7f || (byte < 0x20 && byte !== 0x09 && byte !== 0x0a)) banned.add(id);
    }
  }
  return banned;
}

/** Overwrites a tensor's random values so the model writes only text (TinyLlamaOptions.textOnly). */
function textOnlyTensor(name: string, values: Float32Array, dims: number[], embd: number, banned: Set<number>): void {
  if (name === "token_embd.weight") {
    for (let offset = 0; offset < values.length; offset += embd) values[offset] = TEXT_ONLY_CONSTANT;
  } else if (name.endsWith("attn_output.weight") || name.endsWith("ffn_down.weight")) {
    // Output row 0 (dims[0] contiguous inputs per output): no layer changes axis 0.
    values.fill(0, 0, dims[0] as number);
  } else if (name === "output.weight") {
    for (const id of banned) values[id * embd] = -TEXT_ONLY_BAN;
  }
}

function positiveInt(value: number, what: string): number {
  if (!Number.isInteger(value) || value <= 0) throw new RangeError(`writeTinyLlamaGguf: ${what} must be a positive integer, got ${value}.`);
  return value;
}

/** Writes a tiny llama GGUF v3 file with random F32 weights and returns what it wrote. */
export async function writeTinyLlamaGguf(options: TinyLlamaOptions): Promise<TinyLlamaInfo> {
  const embd = positiveInt(options.embeddingLength ?? 64, "embeddingLength");
  const layers = positiveInt(options.layers ?? 2, "layers");
  const heads = positiveInt(options.heads ?? 4, "heads");
  const kvHeads = positiveInt(options.kvHeads ?? heads, "kvHeads");
  const ff = positiveInt(options.feedForwardLength ?? embd * 2, "feedForwardLength");
  const contextLength = positiveInt(options.contextLength ?? 4096, "contextLength");
  if (embd % heads !== 0) throw new RangeError(`writeTinyLlamaGguf: embeddingLength ${embd} is not a multiple of heads ${heads}.`);
  if (heads % kvHeads !== 0) throw new RangeError(`writeTinyLlamaGguf: heads ${heads} is not a multiple of kvHeads ${kvHeads}.`);
  const headDim = embd / heads;

  const vocab = buildVocab();
  const plan = planTensors({ embd, layers, heads, kvHeads, ff, vocab: vocab.tokens.length });
  const script = options.replyScript === undefined ? undefined : scriptAxes(options.replyScript, vocab, embd);
  const textBans = options.textOnly === true && script === undefined ? bannedForText(vocab) : undefined;

  const u32 = (value: number): TypedMetadataValue => ({ value, type: GGUFValueType.UINT32 });
  const metadata: Record<string, TypedMetadataValue> = {
    "general.architecture": { value: "llama", type: GGUFValueType.STRING },
    "general.name": { value: options.name ?? "llmgw tiny llama", type: GGUFValueType.STRING },
    "general.alignment": u32(GGUF_ALIGNMENT),
    "general.file_type": u32(0), // ALL_F32
    "llama.context_length": u32(contextLength),
    "llama.embedding_length": u32(embd),
    "llama.block_count": u32(layers),
    "llama.feed_forward_length": u32(ff),
    "llama.attention.head_count": u32(heads),
    "llama.attention.head_count_kv": u32(kvHeads),
    "llama.attention.layer_norm_rms_epsilon": { value: 1e-5, type: GGUFValueType.FLOAT32 },
    "llama.rope.dimension_count": u32(headDim),
    "llama.rope.freq_base": { value: 10000, type: GGUFValueType.FLOAT32 },
    "tokenizer.ggml.model": { value: "llama", type: GGUFValueType.STRING },
    "tokenizer.ggml.tokens": { value: vocab.tokens, type: GGUFValueType.ARRAY, subType: GGUFValueType.STRING },
    "tokenizer.ggml.scores": { value: vocab.scores, type: GGUFValueType.ARRAY, subType: GGUFValueType.FLOAT32 },
    "tokenizer.ggml.token_type": { value: vocab.types, type: GGUFValueType.ARRAY, subType: GGUFValueType.INT32 },
    "tokenizer.ggml.unknown_token_id": u32(vocab.ids.unk),
    "tokenizer.ggml.bos_token_id": u32(vocab.ids.bos),
    // `<|im_end|>` is the end of generation, so a ChatML turn ends the response.
    "tokenizer.ggml.eos_token_id": u32(vocab.ids.eos),
    "tokenizer.ggml.add_bos_token": { value: true, type: GGUFValueType.BOOL },
    "tokenizer.ggml.add_eos_token": { value: false, type: GGUFValueType.BOOL },
    "tokenizer.chat_template": { value: TINY_CHAT_TEMPLATE, type: GGUFValueType.STRING },
    ...options.extraMetadata,
  };

  const random = createPrng(options.seed ?? 1);
  const tensors: GgufTensor[] = plan.map((tensor) => ({
    name: tensor.name,
    dims: tensor.dims,
    data: (values: Float32Array) => {
      if (tensor.init === "ones") values.fill(1);
      else fillUniform(values, random, tensor.init.scale);
      if (script) scriptTensor(tensor.name, values, embd, script);
      else if (textBans) textOnlyTensor(tensor.name, values, tensor.dims, embd, textBans);
      if (!script && options.endless && tensor.name === "output.weight") {
        // Row t (ne0 = embd contiguous values) projects the hidden state onto token t.
        for (const [id, type] of vocab.types.entries()) if (type === TYPE_CONTROL || type === TYPE_UNKNOWN) values.fill(0, id * embd, (id + 1) * embd);
      }
    },
  }));
  const written = await writeGguf({ path: options.path, metadata, tensors, caller: "writeTinyLlamaGguf" });
  return {
    path: options.path,
    bytes: written.bytes,
    parameterCount: written.parameterCount,
    vocabSize: vocab.tokens.length,
    tensorCount: plan.length,
    tokens: vocab.ids,
  };
}
