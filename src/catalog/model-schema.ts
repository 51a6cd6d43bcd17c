// The shape of a model in the catalog, as the admin API accepts and returns it
// (snake_case, like the rest of the wire formats). One zod schema validates a new model;
// `applyModelPatch` merges a partial change and re-validates the result, so a malformed
// entry is refused with the field named, whatever the route.
import path from "node:path";
import { z } from "zod";
import { BadRequestError, parseWith } from "../core/errors.ts";
import { pathProblem, segmentProblem } from "../registry/repo-path.ts";
import { adapterSchema, checkAdapters, MAX_ADAPTERS } from "./adapter-schema.ts";
import { modelName } from "./model-name.ts";

export { adapterServedName, assertAdapterNames, MAX_ADAPTERS, type AdapterDefinition } from "./adapter-schema.ts";

/**
 * A llama.cpp replica's context when its profile does not say: a pool shared by its
 * parallel requests, each given this much (DESIGN.md, the serve job). Plans use the pool.
 */
export const DEFAULT_CONTEXT_POOL = 16384;
export const DEFAULT_CONTEXT_PER_REQUEST = 4096;

/** Requests the gateway has in flight at one external server unless its profile says otherwise. */
export const DEFAULT_EXTERNAL_MAX_INFLIGHT = 64;
/** scaling.idle_seconds by default: an on-demand replica (scaling.min 0) stops after 15 idle minutes. */
export const DEFAULT_IDLE_SECONDS = 900;
/** Requests that may wait for a free replica of a model, and how long each may wait. */
export const DEFAULT_QUEUE_SIZE = 256;
export const DEFAULT_QUEUE_TIMEOUT_SECONDS = 60;

/**
 * Bounds a model must keep to be accepted (POST and PATCH of /api/v1/models). They are
 * checked at the door only, not on rows read back from the store: a row stored before a
 * bound existed still loads and runs as before, and the next change to it must bring it
 * within the bounds.
 *
 * - ctx_size: llama.cpp keeps n_ctx in a uint32 and pads it up to a multiple of 256
 *   (src/llama-context.cpp of the bundled v0.4.0: `GGML_PAD(cparams.n_ctx, 256)`), so a
 *   context below 256 tokens would allocate 256 anyway; the bundled engine (`llmgw engine
 *   --ctx-size`, src/engines/llamacpp/engine-command.ts) accepts at most 16,777,216.
 * - parallel: llama.cpp allows 256 sequences (LLAMA_MAX_SEQ), but the slots of one replica
 *   share its context and its CPU: past 64 each request gets a sliver of both. More
 *   requests at once need more replicas (scaling.max). 64 is also the in-flight limit of an
 *   external profile by default.
 * - scaling.max: 64 replicas per model; more is a typo or a runaway script.
 */
export const LIMITS = {
  ctxSize: { min: 256, max: 16_777_216 },
  parallel: { max: 64 },
  replicas: { max: 64 },
} as const;

/**
 * How a guard model answers (reference/protocols.md §6): Llama Guard 3's "safe"/"unsafe"
 * lines, ShieldGemma's Yes/No, or a JSON verdict.
 */
export const GUARD_FORMATS = ["llama-guard-3", "shieldgemma", "json"] as const;

/** The CLI's and serve requests' spelling of a guard format, accepted here too and stored as the catalog's. */
const GUARD_FORMAT_ALIASES: Record<string, (typeof GUARD_FORMATS)[number]> = { llamaguard3: "llama-guard-3" };
const guardFormat = z.preprocess(
  (value) => (typeof value === "string" ? (GUARD_FORMAT_ALIASES[value] ?? value) : value),
  z.enum(GUARD_FORMATS, { error: `must be one of ${GUARD_FORMATS.join(", ")} (llamaguard3 is accepted for llama-guard-3)` }),
);

export { MODEL_NAME_PATTERN } from "./model-name.ts";

const positiveInt = z.number().int().positive();

/** How the gateway picks among a model's ready replicas (see `routing` below). */
export const ROUTING_MODES = ["least-busy", "prefix"] as const;

/**
 * Prefix routing's settings, with the bounds a request can meet:
 * - chars: characters of a conversation's start (tools, system prompt, first question)
 *   that are hashed. The default covers a system prompt of about a thousand tokens and the
 *   question after it, and hashing that much costs microseconds; under 16 nearly every
 *   conversation shares one start (a role name and a greeting); 65,536 is far past any
 *   system prompt worth telling apart.
 * - load_factor: a replica with more than load_factor × the mean requests in flight (the new
 *   one counted, rounded up) is passed over. 1 keeps replicas as even as whole requests
 *   allow; over 10 is no bound at all.
 */
export const PREFIX_ROUTING_DEFAULTS = { chars: 4096, load_factor: 1.25 } as const;

/**
 * Autoscaling between scaling.min and scaling.max (src/fleet/autoscaler.ts), in seconds:
 * - up_after: a load above the target must last this long before replicas are added, so a
 *   burst the queue absorbs starts no engine (a replica takes seconds to minutes to load).
 *   At most an hour: later than that, the queue's timeout has long failed the requests.
 * - down_after: a load below half the target must last this long before one replica goes;
 *   five minutes rides out the lulls of chat traffic without keeping idle engines for long.
 *   At least up_after (a replica would go sooner than one comes), at most a day.
 * - target (no constant): requests in flight and queued per replica; by default the
 *   replica's parallel (its slots), so the model scales up once requests start to queue.
 */
export const SCALING_DEFAULTS = { up_after: 15, down_after: 300 } as const;
export const SCALING_LIMITS = { target: { max: 100_000 }, up_after: { max: 3600 }, down_after: { max: 86_400 } } as const;
const prefixRouting = z.strictObject({
  chars: z.number().int().min(16, "must be at least 16").max(65_536, "must be at most 65536").default(PREFIX_ROUTING_DEFAULTS.chars),
  load_factor: z
    .number()
    .min(1, "must be at least 1 (1 keeps replicas as even as whole requests allow)")
    .max(10, "must be at most 10")
    .default(PREFIX_ROUTING_DEFAULTS.load_factor),
});

/**
 * The guard models a serving model's requests go through (names or aliases of catalog
 * models with role guard): `input` before a replica is asked, `output` on answers that are
 * not streamed, before the client sees them.
 */
const guardLists = z.strictObject({
  input: z.array(modelName).max(8, "at most 8 guard models").default([]),
  output: z.array(modelName).max(8, "at most 8 guard models").default([]),
});

const cpuHardware = z.strictObject({
  min_memory_gb: z.number().positive().optional(),
  cores: positiveInt.optional(),
});

const gpuHardware = z.strictObject({
  class: z.string().min(1).describe("GPU class, for example H200 or RTX4090"),
  gpus_per_node: positiveInt.default(1),
  nodes: positiveInt.default(1),
});

export const profileSchema = z
  .strictObject({
    name: z.string().regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/, "must be 1-64 letters, digits, '.', '_' or '-'"),
    engine: z.enum(["llamacpp", "vllm", "external"]),
    priority: z.number().int().default(0),
    weight: z.number().positive().default(1),
    /**
     * Extra command-line arguments passed to the engine as they are, after llmgw's own.
     * Checked when a model is added or its profiles change (engines/engine-args-check.ts),
     * not here: a stored row this version would refuse still loads and runs.
     */
    engine_args: z.array(z.string()).default([]),
    /** llama.cpp: total context shared by the parallel sequences. */
    ctx_size: positiveInt.optional(),
    /** llama.cpp: requests one replica serves at once. */
    parallel: positiveInt.optional(),
    threads: z.number().int().min(0).optional(),
    /** llama.cpp: a dedicated embedding model; the replica serves /v1/embeddings only, with no generation context. */
    embeddings: z.boolean().optional(),
    hardware: z.strictObject({ cpu: cpuHardware.optional(), gpu: gpuHardware.optional() }).default({}),
    /** external: base URL of an existing OpenAI-compatible server (up to, not including, /v1). */
    url: z.url({ protocol: /^https?$/, error: "must be an http(s) URL" }).optional(),
    /** external: the key that server expects, as clients send it. Never stored or returned: the catalog seals it (sealed-keys.ts). */
    api_key: z.string().min(1).optional(),
    /** external: api_key as the database holds it, sealed with the server's secret box; written by the catalog only, never by clients. */
    api_key_sealed: z.string().min(1).optional(),
    /** external: the model name that server knows this model by (default: the catalog name). */
    upstream_model: z.string().min(1).optional(),
    /** external: requests the gateway sends that server at once (default 64); more wait in the model's queue. */
    max_inflight: z.number().int().min(1).max(4096).optional(),
    /**
     * external: the server keeps to max_tokens, so a non-stream request of a key with limits
     * is sent to it as it is (default false: llmgw asks for a stream and stops it at the
     * reserved output; gateway/relay-assembled.ts).
     */
    trust_max_tokens: z.boolean().optional(),
  })
  .superRefine((profile, ctx) => {
    if (profile.engine === "external" && profile.url === undefined) {
      ctx.addIssue({ code: "custom", path: ["url"], message: "an external profile needs the URL of the server it routes to" });
    }
    if (profile.url !== undefined) {
      const url = new URL(profile.url);
      // Credentials in the URL would be shown by GET /api/v1/models and dropped when routing.
      if (url.username !== "" || url.password !== "") {
        ctx.addIssue({ code: "custom", path: ["url"], message: "must not carry a user or password; put the server's key in api_key" });
      }
      if (url.search !== "" || url.hash !== "") {
        ctx.addIssue({ code: "custom", path: ["url"], message: "must be a base URL without ?query or #fragment (requests go to URL/v1/...)" });
      }
    }
    if (profile.engine !== "external" && profile.trust_max_tokens !== undefined) {
      ctx.addIssue({ code: "custom", path: ["trust_max_tokens"], message: `belongs to external profiles: llmgw runs ${profile.engine} engines itself` });
    }
    if (profile.engine !== "external" && (profile.url !== undefined || profile.api_key !== undefined || profile.api_key_sealed !== undefined)) {
      ctx.addIssue({ code: "custom", path: ["url"], message: `url and api_key belong to external profiles, not ${profile.engine}` });
    }
    if (profile.engine !== "external" && profile.max_inflight !== undefined) {
      ctx.addIssue({
        code: "custom",
        path: ["max_inflight"],
        message: `belongs to external profiles; a ${profile.engine} replica serves 'parallel' requests at once`,
      });
    }
    if (profile.embeddings === true && profile.engine !== "llamacpp") {
      // vLLM selects its pooling runner with a flag that changed between versions (--task
      // embed, later --runner pooling); the operator's engine_args say which their vLLM takes.
      // An external server is what it is.
      const hint = profile.engine === "vllm" ? "; for vLLM pass its pooling runner in engine_args (--runner pooling, or --task embed on older vLLM)" : "";
      ctx.addIssue({ code: "custom", path: ["embeddings"], message: `belongs to llamacpp profiles${hint}` });
    }
    if (profile.hardware.cpu !== undefined && profile.hardware.gpu !== undefined) {
      ctx.addIssue({ code: "custom", path: ["hardware"], message: "give either cpu or gpu hardware, not both" });
    }
  });

/** Where a node finds the weights: a local file (embedded mode) or the mirror. */
// `projector`: the vision projector llama-server loads beside the weights (--mmproj): an
// absolute path for a file source, a file of the same mirrored version for a mirror source.
const sourceSchema = z.discriminatedUnion("kind", [
  z.strictObject({ kind: z.literal("file"), path: z.string().min(1), projector: z.string().min(1).optional() }),
  z.strictObject({
    kind: z.literal("mirror"),
    model: z.string().min(1),
    version: z.string().min(1),
    file: z.string().min(1),
    projector: z.string().min(1).optional(),
  }),
]);

const originFiles = z.array(
  z.strictObject({ path: z.string().min(1), sha256: z.string().regex(/^[0-9a-f]{64}$/, "must be 64 lower-case hex digits"), bytes: z.number().int().min(0) }),
);

/**
 * Where the weights came from (provenance): the repository, the commit, and every file
 * with the sha256 and size it was verified with. An update keeps the revision it replaced
 * in `previous` (with that revision's source), so a rollback knows where to return to.
 */
const originSchema = z.strictObject({
  repo: z.string().min(1),
  revision: z.string().min(1),
  /** The branch or tag the model follows for updates (default main). */
  ref: z.string().min(1).optional(),
  files: originFiles,
  previous: z.strictObject({ revision: z.string().min(1), files: originFiles, source: sourceSchema }).optional(),
});

const modelFields = {
  aliases: z.array(modelName).default([]),
  description: z.string().max(2000).default(""),
  /**
   * How the gateway picks a replica: the least busy (default), or by prefix affinity, so a
   * conversation returns to the replica whose engine still holds its prompt's start
   * (gateway/prefix-affinity.ts).
   */
  routing: z.enum(ROUTING_MODES, { error: `must be one of ${ROUTING_MODES.join(", ")}` }).default("least-busy"),
  /**
   * routing "prefix": how much of the prompt is hashed, and how far above the mean load a
   * replica may go before a request skips it (kept, unused, under least-busy). Stored only
   * when given, so a model that never set it stays readable by servers that predate it;
   * the API shows the defaults (redactDefinition).
   */
  prefix: prefixRouting.optional(),
  context_length: positiveInt.optional(),
  max_output: positiveInt.optional(),
  capabilities: z.strictObject({ vision: z.boolean().default(false), embeddings: z.boolean().default(false) }).default({ vision: false, embeddings: false }),
  role: z.enum(["serve", "guard"]).default("serve"),
  guard_format: guardFormat.optional(),
  /** Serving models: the guard models that check its requests (src/policy/guards.ts). */
  guards: guardLists.optional(),
  /** Guard models: what a request does when this guard fails or answers garbage: refused with 503 (block, the default) or let through with a logged warning (allow). */
  guard_on_error: z.enum(["block", "allow"]).optional(),
  /**
   * Serving models with output guards: what a streamed request gets. Output guards read the
   * whole answer before any of it is sent, which a stream cannot wait for: refused with 400
   * (refuse, the default), or streamed without the output check (unchecked).
   */
  output_guard_streams: z.enum(["refuse", "unchecked"]).optional(),
  profiles: z.array(profileSchema).min(1, "a model needs at least one profile"),
  scaling: z
    .strictObject({
      min: z.number().int().min(0).default(1),
      max: z.number().int().min(0).default(1),
      /** With min 0: seconds without requests before the on-demand replica stops (0: it stays once started). */
      idle_seconds: z.number().int().min(0).default(DEFAULT_IDLE_SECONDS),
      /** Requests in flight and queued per ready replica the autoscaler aims for (default: the replica's parallel). */
      target: z
        .number({ error: "must be a number of requests per replica" })
        .positive("must be above 0: the requests in flight and queued that one replica is meant to carry")
        .max(SCALING_LIMITS.target.max, `must be at most ${SCALING_LIMITS.target.max}`)
        .optional(),
      /** Seconds above the target before replicas are added (default 15). */
      up_after: z
        .number({ error: "must be a number of seconds" })
        .min(0, "must be 0 or more seconds")
        .max(SCALING_LIMITS.up_after.max, `must be at most ${SCALING_LIMITS.up_after.max} seconds`)
        .optional(),
      /** Seconds below half the target before one replica goes (default 300). */
      down_after: z
        .number({ error: "must be a number of seconds" })
        .min(0, "must be 0 or more seconds")
        .max(SCALING_LIMITS.down_after.max, `must be at most ${SCALING_LIMITS.down_after.max} seconds`)
        .optional(),
    })
    .default({ min: 1, max: 1, idle_seconds: DEFAULT_IDLE_SECONDS }),
  /** Requests that may wait for a free replica (0: none wait; a busy model answers 429 at once). */
  queue_size: z.number().int().min(0).max(100_000).default(DEFAULT_QUEUE_SIZE),
  /** Seconds a waiting request may wait before it gets 503 queue_timeout. */
  queue_timeout: z.number().positive().max(3600).default(DEFAULT_QUEUE_TIMEOUT_SECONDS),
  prices: z
    .strictObject({ input_per_million: z.number().min(0).default(0), output_per_million: z.number().min(0).default(0) })
    .default({ input_per_million: 0, output_per_million: 0 }),
  origin: originSchema.optional(),
  source: sourceSchema.optional(),
  adapters: z.array(adapterSchema).max(MAX_ADAPTERS, `at most ${MAX_ADAPTERS} adapters per model`).default([]),
};

function checkModel(
  model: {
    name?: string;
    aliases: string[];
    role: string;
    guard_format?: string | undefined;
    guards?: { input: string[]; output: string[] } | undefined;
    guard_on_error?: string | undefined;
    output_guard_streams?: string | undefined;
    profiles: { name: string; engine: string }[];
    scaling: { min: number; max: number; up_after?: number | undefined; down_after?: number | undefined };
    source?: { projector?: string | undefined } | undefined;
    capabilities: { vision: boolean };
    adapters: { name: string; served_name?: string | undefined; source: { kind: string; path?: string } }[];
  },
  ctx: z.RefinementCtx,
): void {
  if (model.scaling.max < model.scaling.min) {
    ctx.addIssue({ code: "custom", path: ["scaling", "max"], message: `must be at least scaling.min (${model.scaling.min})` });
  }
  const upAfter = model.scaling.up_after ?? SCALING_DEFAULTS.up_after;
  const downAfter = model.scaling.down_after ?? SCALING_DEFAULTS.down_after;
  if (downAfter < upAfter) {
    // A replica would be taken away sooner than a lasting load adds one: the model would flap.
    const field = model.scaling.down_after === undefined ? ["scaling", "up_after"] : ["scaling", "down_after"];
    const message =
      model.scaling.down_after === undefined
        ? `must be at most scaling.down_after (${downAfter} s by default), or set a longer down_after`
        : `must be at least scaling.up_after (${upAfter} s): a replica would go sooner than a lasting load adds one`;
    ctx.addIssue({ code: "custom", path: field, message });
  }
  if (model.role === "guard" && model.guard_format === undefined) {
    ctx.addIssue({ code: "custom", path: ["guard_format"], message: `a guard model needs guard_format (${GUARD_FORMATS.join(", ")})` });
  }
  if (model.role === "guard" && model.guards !== undefined && model.guards.input.length + model.guards.output.length > 0) {
    // A guard asked about a request would need its own guards asked first: a chain with no end.
    ctx.addIssue({ code: "custom", path: ["guards"], message: "a guard model cannot itself have guards; remove them or give the model role serve" });
  }
  if (model.role !== "guard" && model.guard_on_error !== undefined) {
    ctx.addIssue({ code: "custom", path: ["guard_on_error"], message: "belongs to guard models (role guard): it says what happens when that guard fails" });
  }
  if (model.role === "guard" && model.output_guard_streams !== undefined) {
    ctx.addIssue({
      code: "custom",
      path: ["output_guard_streams"],
      message: "belongs to serving models: it says whether their streams pass without the output guards",
    });
  }
  const profileNames = new Set<string>();
  model.profiles.forEach((profile, index) => {
    if (profileNames.has(profile.name))
      ctx.addIssue({ code: "custom", path: ["profiles", index, "name"], message: `profile name '${profile.name}' is used twice` });
    profileNames.add(profile.name);
  });
  const seen = new Set<string>(model.name === undefined ? [] : [model.name]);
  model.aliases.forEach((alias, index) => {
    if (seen.has(alias)) ctx.addIssue({ code: "custom", path: ["aliases", index], message: `'${alias}' repeats the model name or another alias` });
    seen.add(alias);
  });
  const needsWeights = model.profiles.some((p) => p.engine !== "external");
  if (needsWeights && model.source === undefined) {
    ctx.addIssue({ code: "custom", path: ["source"], message: "llamacpp and vllm profiles need a weights source ({kind:'file', path} or a mirror location)" });
  }
  checkAdapters(model, ctx);
  if (model.source?.projector !== undefined) {
    // Only llama-server loads a projector (--mmproj); vLLM models carry their vision parts in their own weights.
    if (!model.profiles.some((p) => p.engine === "llamacpp")) {
      ctx.addIssue({
        code: "custom",
        path: ["source", "projector"],
        message: "a vision projector goes with GGUF weights on llamacpp profiles (llama-server's --mmproj)",
      });
    }
    if (!model.capabilities.vision) {
      ctx.addIssue({
        code: "custom",
        path: ["capabilities", "vision"],
        message: "must be true for a model with a vision projector (source.projector), so the gateway lets image parts through",
      });
    }
  }
}

type DoorFields = {
  profiles: { ctx_size?: number | undefined; parallel?: number | undefined }[];
  scaling: { max: number };
  source?:
    | { kind: "file"; path: string; projector?: string | undefined }
    | { kind: "mirror"; model: string; version: string; file: string; projector?: string | undefined }
    | undefined;
};

/** The bounds of LIMITS and the shape of a weights source, for what is about to be stored. */
function checkLimits(model: DoorFields, ctx: z.RefinementCtx): void {
  model.profiles.forEach((profile, index) => {
    const { ctx_size: ctxSize, parallel } = profile;
    if (ctxSize !== undefined && (ctxSize < LIMITS.ctxSize.min || ctxSize > LIMITS.ctxSize.max)) {
      ctx.addIssue({
        code: "custom",
        path: ["profiles", index, "ctx_size"],
        message: `must be from ${LIMITS.ctxSize.min} to ${LIMITS.ctxSize.max} tokens (llama.cpp allocates the context in steps of 256; the bundled engine accepts at most ${LIMITS.ctxSize.max}), got ${ctxSize}`,
      });
    }
    if (parallel !== undefined && parallel > LIMITS.parallel.max) {
      ctx.addIssue({
        code: "custom",
        path: ["profiles", index, "parallel"],
        message: `must be at most ${LIMITS.parallel.max} requests per replica, got ${parallel}; serve more at once with more replicas (scaling.max)`,
      });
    } else if (parallel !== undefined) {
      // The pool is shared by the parallel requests: each must get room for a real prompt,
      // or the replica starts and then refuses every request as too long.
      const pool = ctxSize ?? DEFAULT_CONTEXT_POOL;
      const perRequest = Math.floor(pool / parallel);
      if (perRequest < LIMITS.ctxSize.min) {
        ctx.addIssue({
          code: "custom",
          path: ["profiles", index, "parallel"],
          message: `leaves each request ${perRequest} tokens of the ${pool}-token context (ctx_size), less than ${LIMITS.ctxSize.min}; lower parallel or raise ctx_size`,
        });
      }
    }
  });
  if (model.scaling.max > LIMITS.replicas.max) {
    ctx.addIssue({ code: "custom", path: ["scaling", "max"], message: `must be at most ${LIMITS.replicas.max} replicas, got ${model.scaling.max}` });
  }
  const source = model.source;
  if (source?.kind === "file" && !path.isAbsolute(source.path)) {
    ctx.addIssue({
      code: "custom",
      path: ["source", "path"],
      message: `must be an absolute path on the server's machine, got '${source.path}' ('llmgw ctl model add --gguf' turns a relative path into an absolute one)`,
    });
  }
  if (source?.kind === "file" && source.projector !== undefined && !path.isAbsolute(source.projector)) {
    ctx.addIssue({ code: "custom", path: ["source", "projector"], message: `must be an absolute path on the server's machine, got '${source.projector}'` });
  }
  if (source?.kind === "mirror") {
    // The mirror keeps files at MIRROR/{model}/{version}/{file}: no part may climb out of it.
    for (const key of ["model", "version"] as const) {
      const problem = segmentProblem(source[key]);
      if (problem !== null)
        ctx.addIssue({ code: "custom", path: ["source", key], message: `must be one folder name as 'llmgw ctl mirror list' shows it, but ${problem}` });
    }
    const problem = pathProblem(source.file);
    if (problem !== null)
      ctx.addIssue({
        code: "custom",
        path: ["source", "file"],
        message: `must be a file path inside the mirrored version as 'llmgw ctl mirror list' shows it, but ${problem}`,
      });
    const projectorProblem = source.projector === undefined ? null : pathProblem(source.projector);
    if (projectorProblem !== null)
      ctx.addIssue({
        code: "custom",
        path: ["source", "projector"],
        message: `must be a file path inside the mirrored version as 'llmgw ctl mirror list' shows it, but ${projectorProblem}`,
      });
  }
}

export const newModelSchema = z
  .strictObject({ name: modelName, ...modelFields })
  .superRefine(checkModel)
  .superRefine(checkLimits);

/** A stored model definition: everything but the name, which is its own column. */
export const modelDefinitionSchema = z.strictObject(modelFields).superRefine(checkModel);

/** A changed definition about to be stored: the stored shape within LIMITS. */
const changedDefinitionSchema = modelDefinitionSchema.superRefine(checkLimits);

export type NewModel = z.output<typeof newModelSchema>;
export type ModelDefinition = z.output<typeof modelDefinitionSchema>;
export type Profile = z.output<typeof profileSchema>;

/** PATCH bodies: any top-level field; `name` renames. Profiles are replaced as a whole list. */
export const modelPatchSchema = z.strictObject({
  name: modelName.optional(),
  aliases: z.array(modelName).optional(),
  description: z.string().max(2000).optional(),
  routing: z.enum(ROUTING_MODES, { error: `must be one of ${ROUTING_MODES.join(", ")}` }).optional(),
  /** Merged into the stored settings like scaling; null goes back to the defaults. */
  prefix: z.record(z.string(), z.unknown()).nullable().optional(),
  context_length: positiveInt.nullable().optional(),
  max_output: positiveInt.nullable().optional(),
  capabilities: z.unknown().optional(),
  role: z.enum(["serve", "guard"]).optional(),
  guard_format: guardFormat.nullable().optional(),
  guards: z.unknown().optional(),
  guard_on_error: z.enum(["block", "allow"]).nullable().optional(),
  output_guard_streams: z.enum(["refuse", "unchecked"]).nullable().optional(),
  profiles: z.array(z.unknown()).optional(),
  scaling: z.record(z.string(), z.unknown()).optional(),
  queue_size: z.unknown().optional(),
  queue_timeout: z.unknown().optional(),
  prices: z.record(z.string(), z.unknown()).optional(),
  origin: z.unknown().optional(),
  source: z.unknown().optional(),
  adapters: z.array(z.unknown()).optional(),
});

export type ModelPatch = z.output<typeof modelPatchSchema>;

export function parseNewModel(body: unknown): NewModel {
  refuseSealedKeys(body);
  return parseWith(newModelSchema, body, "model");
}

/**
 * Only the catalog writes api_key_sealed. A client that sends one (copied from a database
 * dump, say) could not know which key it was sealed with: it sends the key itself.
 */
function refuseSealedKeys(body: unknown): void {
  const profiles = typeof body === "object" && body !== null ? (body as { profiles?: unknown }).profiles : undefined;
  if (!Array.isArray(profiles)) return;
  profiles.forEach((profile, index) => {
    if (typeof profile === "object" && profile !== null && "api_key_sealed" in profile) {
      throw new BadRequestError(
        `Invalid model: field 'profiles.${index}.api_key_sealed': is written by llmgw only; send the external server's key as api_key and llmgw seals it.`,
        { param: `profiles.${index}.api_key_sealed`, code: "invalid_field" },
      );
    }
  });
}

/**
 * Applies a PATCH to a stored definition and validates the result as a whole. Nested
 * objects (scaling, prices, guards) merge field by field; a null removes a field, at the top or
 * inside one of them (it goes back to its default). An
 * external profile sent without its api_key keeps the stored one, because clients never
 * see stored keys and could not send them back.
 */
export function applyModelPatch(current: ModelDefinition, patchBody: unknown): { name: string | undefined; definition: ModelDefinition } {
  refuseSealedKeys(patchBody);
  const patch = parseWith(modelPatchSchema, patchBody, "model change");
  const { name, ...fields } = patch;
  const merged: Record<string, unknown> = { ...current };
  for (const [key, value] of Object.entries(fields)) {
    if (value === undefined) continue;
    if (value === null) {
      delete merged[key];
    } else if ((key === "scaling" || key === "prices" || key === "guards" || key === "prefix") && typeof value === "object") {
      // A null field inside goes back to its default (scaling.target: null, the replica's parallel).
      const fieldsMerged = Object.entries({ ...(current[key] as object), ...(value as object) }).filter(([, inner]) => inner !== null);
      merged[key] = Object.fromEntries(fieldsMerged);
    } else {
      merged[key] = value;
    }
  }
  if (Array.isArray(fields.profiles)) {
    merged.profiles = fields.profiles.map((profile) => keepStoredApiKey(profile, current.profiles));
  }
  const definition = parseWith(changedDefinitionSchema, merged, "model");
  if (name !== undefined && definition.aliases.includes(name)) {
    throw new BadRequestError(`Invalid model: field 'aliases': '${name}' repeats the model name.`, { param: "aliases", code: "invalid_field" });
  }
  return { name, definition };
}

/** A profile sent without api_key keeps the stored one, sealed as it is (or plain, on a row not yet sealed). */
function keepStoredApiKey(profile: unknown, stored: Profile[]): unknown {
  if (typeof profile !== "object" || profile === null) return profile;
  const candidate = profile as { name?: unknown; engine?: unknown; api_key?: unknown };
  if (candidate.engine !== "external" || candidate.api_key !== undefined) return profile;
  const previous = stored.find((p) => p.name === candidate.name && p.engine === "external");
  if (previous?.api_key_sealed !== undefined) return { ...candidate, api_key_sealed: previous.api_key_sealed };
  return previous?.api_key === undefined ? profile : { ...candidate, api_key: previous.api_key };
}

/** The model as the API shows it: secrets, sealed or not, replaced by whether they are set. */
export function redactDefinition(definition: ModelDefinition): Record<string, unknown> {
  return {
    ...definition,
    // A prefix-routed model shows the settings it routes with, the defaults included.
    ...(definition.routing === "prefix" ? { prefix: definition.prefix ?? PREFIX_ROUTING_DEFAULTS } : {}),
    profiles: definition.profiles.map(({ api_key, api_key_sealed, ...rest }) =>
      rest.engine === "external" ? { ...rest, api_key_set: api_key !== undefined || api_key_sealed !== undefined } : rest,
    ),
  };
}
