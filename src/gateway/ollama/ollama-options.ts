// Ollama's `options` object (the sampling and load settings of a Modelfile's PARAMETER
// lines, per request) checked with one zod schema and mapped onto the chat-completions
// body. The rule for each option:
// - the samplers the engines take are mapped: temperature, top_p, top_k, min_p, seed,
//   num_predict (max_tokens), stop, repeat_penalty, presence_penalty, frequency_penalty
//   (the fields of engines/llamacpp/sampling-fields.ts and openai-wire.ts, which
//   llama-server and vLLM read too);
// - samplers not every engine has (typical_p, tfs_z, mirostat, a repeat window other than
//   the engines' own) are accepted at the values that switch them off, and refused
//   otherwise: a request that asked for them would get an answer that ignored them;
// - settings that cannot change the answer are accepted and ignored: the load-time ones
//   (the model's profile fixes the context size, batch, GPUs and threads of every replica,
//   the same for every request and every key), and penalize_newline and numa, which Ollama
//   itself accepts only for compatibility and ignores;
// - any other name is refused, naming `options.<name>`.
// Options a request leaves out keep the engine's and the model's defaults, not Ollama's
// (temperature 0.8, top_k 40, repeat_penalty 1.1...): the same model answers alike on every
// wire format llmgw speaks.
import { z } from "zod";
import type { GatewayRequestBody } from "../request-schemas.ts";

const number = () => z.number({ error: "must be a number" });
const integer = () => z.number({ error: "must be an integer" }).int("must be an integer");
const boolean = () => z.boolean({ error: "must be a boolean (true or false)" });

/** The window llama.cpp's repeat penalties look back over (llama-server's and the bundled engine's default). */
export const ENGINE_REPEAT_WINDOW = 64;

/** Mapped onto the chat body. */
const samplingOptions = {
  temperature: number().min(0, "must be from 0 to 2").max(2, "must be from 0 to 2"),
  top_p: number().min(0, "must be from 0 to 1").max(1, "must be from 0 to 1"),
  // top_k <= 0 keeps the whole vocabulary (sampling-fields.ts).
  top_k: integer().min(-1, "must be 0 or more (0: the whole vocabulary)"),
  min_p: number().min(0, "must be from 0 to 1").max(1, "must be from 0 to 1"),
  seed: integer(),
  // -1 (no limit) and -2 (until the context is full) both leave max_tokens out. 0 is
  // refused rather than answered empty: an answer of nothing costs a replica's time and
  // tells the client nothing it could not know.
  num_predict: integer().refine((n) => n > 0 || n === -1 || n === -2, "must be the most tokens to generate (1 or more), or -1 for no limit"),
  stop: z.array(z.string({ error: "must be an array of strings" }), { error: "must be an array of strings" }),
  repeat_penalty: number().min(0, "must be 0 or more (1: no penalty)"),
  presence_penalty: number().min(-2, "must be from -2 to 2").max(2, "must be from -2 to 2"),
  frequency_penalty: number().min(-2, "must be from -2 to 2").max(2, "must be from -2 to 2"),
};

/** Accepted only at the values that switch them off (checked below). */
const neutralOnlyOptions = {
  typical_p: number(),
  tfs_z: number(),
  repeat_last_n: integer(),
  mirostat: integer(),
  // Tune mirostat only: with mirostat off (the only setting accepted) they change nothing.
  mirostat_tau: number(),
  mirostat_eta: number(),
};

/**
 * Accepted and ignored. The load-time settings are fixed by the model's profile for every
 * replica (llmgw places and starts replicas itself, shared by every key), so one request
 * cannot change them, and none of them changes what the model answers. penalize_newline and
 * numa are kept by Ollama only so that old requests still parse; it ignores them too.
 */
const ignoredOptions = {
  num_ctx: integer(),
  num_batch: integer(),
  num_gpu: integer(),
  main_gpu: integer(),
  low_vram: boolean(),
  f16_kv: boolean(),
  logits_all: boolean(),
  vocab_only: boolean(),
  use_mmap: boolean(),
  use_mlock: boolean(),
  embedding_only: boolean(),
  num_thread: integer(),
  numa: boolean(),
  num_keep: integer(),
  penalize_newline: boolean(),
};

const KNOWN_OPTIONS = { ...samplingOptions, ...neutralOnlyOptions, ...ignoredOptions };
const MAPPED_NAMES = Object.keys(samplingOptions).join(", ");

function isKnownOption(name: string): name is keyof typeof KNOWN_OPTIONS {
  return Object.hasOwn(KNOWN_OPTIONS, name);
}

/** Whether a repeat penalty is asked for: only then does the window it looks over matter. */
function penalises(options: { repeat_penalty?: number | undefined; presence_penalty?: number | undefined; frequency_penalty?: number | undefined }): boolean {
  return (
    (options.repeat_penalty !== undefined && options.repeat_penalty !== 1) ||
    (options.presence_penalty !== undefined && options.presence_penalty !== 0) ||
    (options.frequency_penalty !== undefined && options.frequency_penalty !== 0)
  );
}

export const ollamaOptionsSchema = z
  .looseObject(
    Object.fromEntries(Object.entries(KNOWN_OPTIONS).map(([name, schema]) => [name, schema.optional()])) as {
      [K in keyof typeof KNOWN_OPTIONS]: z.ZodOptional<(typeof KNOWN_OPTIONS)[K]>;
    },
    { error: 'must be an object of Ollama options, such as {"temperature": 0.2}' },
  )
  .superRefine((options, ctx) => {
    const issue = (name: string, message: string) => ctx.addIssue({ code: "custom", path: [name], message });
    for (const name of Object.keys(options)) {
      if (!isKnownOption(name)) issue(name, `is not an Ollama option llmgw takes; the sampling options it applies are ${MAPPED_NAMES}`);
    }
    // llama.cpp switches each of these off at these values (typical_p and tfs_z at 1 or more).
    if (options.typical_p !== undefined && options.typical_p < 1)
      issue("typical_p", "locally typical sampling is not available on every engine llmgw runs; send 1 (off) or leave it out");
    if (options.tfs_z !== undefined && options.tfs_z < 1)
      issue("tfs_z", "tail-free sampling was removed from llama.cpp and no engine llmgw runs has it; send 1 (off) or leave it out");
    if (options.mirostat !== undefined && options.mirostat !== 0)
      issue("mirostat", "mirostat sampling is not available on every engine llmgw runs; send 0 (off) or leave it out, and use temperature, top_p or min_p");
    if (options.repeat_last_n !== undefined && options.repeat_last_n !== ENGINE_REPEAT_WINDOW && penalises(options))
      issue(
        "repeat_last_n",
        `the engines apply repeat penalties over their own window (the last ${ENGINE_REPEAT_WINDOW} tokens on llama.cpp); send ${ENGINE_REPEAT_WINDOW} or leave it out`,
      );
  });

export type OllamaOptions = z.output<typeof ollamaOptionsSchema>;

/** Puts the options the engines take on a chat-completions body. */
export function applyOptions(body: GatewayRequestBody, options: OllamaOptions | undefined): void {
  if (options === undefined) return;
  if (options.temperature !== undefined) body.temperature = options.temperature;
  if (options.top_p !== undefined) body.top_p = options.top_p;
  if (options.top_k !== undefined) body.top_k = options.top_k;
  if (options.min_p !== undefined) body.min_p = options.min_p;
  if (options.seed !== undefined) body.seed = options.seed;
  if (options.num_predict !== undefined && options.num_predict > 0) body.max_tokens = options.num_predict;
  if (options.stop !== undefined && options.stop.length > 0) body.stop = options.stop;
  if (options.repeat_penalty !== undefined) body.repeat_penalty = options.repeat_penalty;
  if (options.presence_penalty !== undefined) body.presence_penalty = options.presence_penalty;
  if (options.frequency_penalty !== undefined) body.frequency_penalty = options.frequency_penalty;
}
