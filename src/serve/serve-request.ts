// What a serve job is asked for, checked at the door: the body of `POST /api/v1/jobs/serve`
// (and so of `ctl model serve`) is parsed and every mistake that can be known before a byte
// is read is refused with what to do instead: the repository's form (or a local path that
// is not there), quant with file, a projector for safetensors, original weights on the
// CPU, a guard model on demand, negative replicas, a context larger than its pool, a
// name or alias already taken, and LoRA adapters that cannot be what the model serves:
// not a repository on the registry, a file that is not GGUF, two with one name, a served
// name already taken, or adapters with safetensors weights (vLLM loads PEFT folders, which
// serve does not fetch yet).
import { stat } from "node:fs/promises";
import path from "node:path";
import { z } from "zod";
import { BadRequestError, ConflictError, LlmgwError, parseWith } from "../core/errors.ts";
import type { Catalog } from "../catalog/catalog.ts";
import { DEFAULT_CONTEXT_PER_REQUEST, DEFAULT_CONTEXT_POOL, LIMITS, MAX_ADAPTERS, MODEL_NAME_PATTERN, adapterServedName } from "../catalog/model-schema.ts";
import { isLocalSource, localSourcePath } from "../registry/local-source.ts";
import { validateRepoName, validateRevision } from "../registry/repo-path.ts";

const modelName = z.string().regex(MODEL_NAME_PATTERN, "must be 1-128 characters of letters, digits and . _ : / @ + -, starting with a letter or digit");
const tokens = z
  .number()
  .int()
  .min(LIMITS.ctxSize.min, `must be at least ${LIMITS.ctxSize.min} tokens`)
  .max(LIMITS.ctxSize.max, `must be at most ${LIMITS.ctxSize.max} tokens`);

const hardwareSchema = z.union([
  z.strictObject({ cpu: z.strictObject({ cores: z.number().int().positive().optional() }) }),
  z.strictObject({
    gpu: z.strictObject({
      class: z.string().min(1, "names the GPU class, for example H200"),
      gpus_per_node: z.number().int().positive().default(1),
      nodes: z.number().int().positive().default(1),
    }),
  }),
]);

/** The catalog's rule for an adapter's short name (model-schema.ts, adapters[].name). */
const ADAPTER_NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;

/** A LoRA adapter from a repository on the registry, served as MODEL:NAME. */
const adapterRequestSchema = z.strictObject({
  repo: z.string({ error: "is required: owner/name of the adapter's repository on the registry" }).min(1),
  revision: z.string().min(1).optional(),
  /** The adapter's GGUF file in the repository; absent: the repository's only .gguf. */
  file: z.string().min(1).optional(),
  /** Absent: from the repository's name (defaultAdapterName). */
  name: z.string().regex(ADAPTER_NAME_PATTERN, "must be 1-64 letters, digits and . _ -, starting with a letter or digit").optional(),
  /** llama.cpp's LoRA scale (the catalog's default is 1, as trained). */
  scale: z.number().gt(0, "must be more than 0").max(8, "must be at most 8").optional(),
});

export type ServeAdapterRequest = z.output<typeof adapterRequestSchema>;

export const serveRequestSchema = z.strictObject({
  repo: z.string({ error: "is required: owner/name on the registry, or a file or folder on the server's machine" }).min(1),
  revision: z.string().min(1).optional(),
  quant: z.string().min(1).optional(),
  file: z.string().min(1).optional(),
  format: z.enum(["gguf", "safetensors"]).optional(),
  projector: z.union([z.string().min(1), z.literal(true)]).optional(),
  /** Where replicas run; absent: what the plan recommends. */
  hardware: hardwareSchema.optional(),
  /** Add the other ways the artifact can run as lower-priority profiles. */
  fallbacks: z.boolean().default(false),
  name: modelName.optional(),
  aliases: z.array(modelName).default([]),
  /** Replicas to keep running; 0 starts one on demand. */
  replicas: z
    .number()
    .int()
    .min(0, "must not be negative: give 0 for a model started on demand, or the replicas to keep running")
    .max(LIMITS.replicas.max)
    .default(1),
  guard_format: z.enum(["llamaguard3", "shieldgemma", "json"]).optional(),
  /** llama.cpp: the context one replica shares among its parallel requests. */
  ctx_pool: tokens.optional(),
  /** llama.cpp: the context each request gets. */
  context: tokens.optional(),
  /** LoRA adapters mirrored from their own repositories and served on the model's replicas. */
  adapters: z.array(adapterRequestSchema).max(MAX_ADAPTERS, `at most ${MAX_ADAPTERS} adapters per model`).default([]),
});

export type ServeRequest = z.output<typeof serveRequestSchema>;

export interface ServeDoorOptions {
  catalog: Pick<Catalog, "resolve">;
  /** Base of relative local paths (the server's working directory). */
  cwd?: string;
}

/** Parses and checks a serve request; throws a 400 or 409 that says what to do instead. */
export async function checkServeRequest(body: unknown, options: ServeDoorOptions): Promise<ServeRequest & { name: string }> {
  const request = parseWith(serveRequestSchema, body, "serve request");
  const refuse = (message: string, param: string) => new BadRequestError(message, { code: "invalid_field", param });
  if (isLocalSource(request.repo)) {
    const where = localSourcePath(request.repo, options.cwd);
    try {
      await stat(where);
    } catch {
      throw new BadRequestError(
        `There is no file or folder '${where}' on the server's machine. Give a path that exists there, or owner/name of a repository.`,
        { code: "local_source_not_found", param: "repo" },
      );
    }
    if (request.revision !== undefined) throw refuse("A local file or folder has no revisions; leave out revision.", "revision");
  } else {
    validateRepoName(request.repo);
    if (request.revision !== undefined) validateRevision(request.revision);
  }
  if (request.quant !== undefined && request.file !== undefined)
    throw refuse("Give quant or file, not both: quant picks a GGUF quantisation, file names one exact file.", "file");
  const safetensors = request.format === "safetensors" || request.file?.endsWith(".safetensors") === true;
  if (request.projector !== undefined && safetensors)
    throw refuse(
      "A vision projector goes with GGUF weights on llama.cpp; safetensors models carry their vision parts themselves. Leave out projector.",
      "projector",
    );
  if (safetensors && request.hardware !== undefined && "cpu" in request.hardware) {
    throw refuse(
      "Original (unquantised safetensors) weights run on vLLM on GPUs, never on the CPU. Give a GPU class, or serve a GGUF quantisation with format gguf.",
      "hardware",
    );
  }
  if (request.guard_format !== undefined && request.replicas === 0) {
    throw refuse("A guard model checks every request it guards, so it needs at least one replica running; give replicas 1 or more.", "replicas");
  }
  const pool = request.ctx_pool ?? DEFAULT_CONTEXT_POOL;
  const perRequest = request.context ?? Math.min(DEFAULT_CONTEXT_PER_REQUEST, pool);
  if (perRequest > pool)
    throw refuse(
      `The context per request (${perRequest}) cannot exceed the context pool (${pool}) it is taken from; raise ctx_pool or lower context.`,
      "context",
    );
  if (Math.floor(pool / perRequest) > LIMITS.parallel.max) {
    throw refuse(
      `A ${pool}-token pool in ${perRequest}-token requests is ${Math.floor(pool / perRequest)} at once, more than ${LIMITS.parallel.max}; raise context or lower ctx_pool.`,
      "context",
    );
  }
  const name = request.name ?? defaultModelName(request.repo, options.cwd);
  for (const [taken, param] of [[name, "name"], ...request.aliases.map((alias) => [alias, "aliases"])] as const) {
    const owner = options.catalog.resolve(taken);
    if (owner !== undefined) {
      throw new ConflictError(
        `The name '${taken}' is already used by model '${owner.name}'. Give another ${param === "name" ? "name (--name)" : "alias"}, move '${owner.name}' to a newer revision with 'llmgw ctl model update ${owner.name}', or remove it first with 'llmgw ctl model remove ${owner.name}'.`,
        { code: "model_exists", param },
      );
    }
  }
  const adapters = checkAdapterRequests({ request, name, safetensors, catalog: options.catalog });
  return { ...request, name, adapters };
}

/**
 * The adapters of a serve request, each with its name (given, or from its repository), or
 * the 400 or 409 that says what to do instead. Where the bytes come from (the file, its
 * fit to the model) is the job's to find out: the registry step reads each repository, and
 * the catalog's door check compares each adapter's header with the model's.
 */
function checkAdapterRequests(input: {
  request: ServeRequest;
  name: string;
  safetensors: boolean;
  catalog: Pick<Catalog, "resolve">;
}): Array<ServeAdapterRequest & { name: string }> {
  const { request } = input;
  if (request.adapters.length === 0) return [];
  if (input.safetensors) {
    throw new BadRequestError(
      "Serve takes LoRA adapters from a repository only for GGUF weights on llama.cpp; for safetensors weights on vLLM it does not fetch adapters yet. " +
        "Serve the model without adapters, then give each as a PEFT adapter folder on the nodes in its definition: " +
        `'llmgw ctl model edit ${input.name} --patch '{"adapters":[{"name":"style","source":{"kind":"file","path":"/adapters/style"}}]}''.`,
      { code: "invalid_field", param: "adapters" },
    );
  }
  const names = new Map<string, number>();
  return request.adapters.map((adapter, index) => {
    const param = `adapters.${index}`;
    if (isLocalSource(adapter.repo)) {
      throw new BadRequestError(
        `Adapter ${index + 1} ('${adapter.repo}') is a local path; serve mirrors adapters from repositories on the registry (owner/name). ` +
          `For a GGUF adapter file on the nodes, add it to the model's definition: 'llmgw ctl model edit ${input.name} --patch' with adapters [{name, source: {kind: "file", path}}].`,
        { code: "invalid_field", param: `${param}.repo` },
      );
    }
    rethrowAt(`${param}.repo`, `Adapter ${index + 1}`, () => validateRepoName(adapter.repo));
    if (adapter.revision !== undefined) {
      const revision = adapter.revision;
      rethrowAt(`${param}.revision`, `Adapter ${index + 1}`, () => validateRevision(revision));
    }
    if (adapter.file !== undefined && !/\.gguf$/i.test(adapter.file)) {
      throw new BadRequestError(
        `Adapter file '${adapter.file}' of ${adapter.repo} is not a .gguf file: llama.cpp loads LoRA adapters converted to GGUF (llama.cpp's convert_lora_to_gguf.py). ` +
          `Name the adapter's .gguf file (--adapter ${adapter.repo}:FILE.gguf), or leave out the file to take the repository's only .gguf.`,
        { code: "invalid_field", param: `${param}.file` },
      );
    }
    const name = adapter.name ?? defaultAdapterName(adapter.repo);
    const first = names.get(name);
    if (first !== undefined) {
      throw new BadRequestError(
        `Adapters ${first + 1} and ${index + 1} are both named '${name}'; give each its own name (--adapter NAME=REPO, or name in the request).`,
        { code: "invalid_field", param: `${param}.name` },
      );
    }
    names.set(name, index);
    const served = adapterServedName(input.name, { name });
    if (request.aliases.includes(served)) {
      throw new BadRequestError(`'${served}' is both an alias of the model and the name of its adapter ${index + 1}; give one of them another name.`, {
        code: "invalid_field",
        param: `${param}.name`,
      });
    }
    const owner = input.catalog.resolve(served);
    if (owner !== undefined) {
      throw new ConflictError(
        `The adapter's name '${served}' is already used by model '${owner.name}'. Give the adapter another name (--adapter NAME=${adapter.repo}), or the model another name (--name).`,
        { code: "model_exists", param: `${param}.name` },
      );
    }
    return { ...adapter, name };
  });
}

/** Runs a check whose error names a top-level field, so that its 400 names the adapter's field instead. */
function rethrowAt(param: string, what: string, check: () => unknown): void {
  try {
    check();
  } catch (error) {
    if (!(error instanceof LlmgwError)) throw error;
    throw new BadRequestError(`${what}: ${error.message}`, { code: error.code, param, cause: error });
  }
}

/**
 * The short name an adapter is served under by default (MODEL:NAME): its repository's name,
 * lower-cased, without a `-GGUF` suffix, cleaned to the letters the catalog takes
 * (`owner/Style-LoRA-GGUF` → `style-lora`).
 */
export function defaultAdapterName(repo: string): string {
  const base = (repo.split("/").at(-1) ?? repo).toLowerCase().replace(/-gguf$/, "");
  const cleaned = base
    .replace(/[^a-z0-9._-]+/g, "-")
    .replace(/^[^a-z0-9]+/, "")
    .slice(0, 64);
  return cleaned === "" ? "adapter" : cleaned;
}

/**
 * The catalog name a repository is served under by default: its name without the owner
 * and without a `-GGUF` suffix (`bartowski/Llama-3.2-1B-Instruct-GGUF` → `Llama-3.2-1B-Instruct`);
 * a local file's name without `.gguf`, or a folder's name.
 */
export function defaultModelName(repo: string, cwd?: string): string {
  const base = isLocalSource(repo) ? path.basename(localSourcePath(repo, cwd)).replace(/\.gguf$/i, "") : (repo.split("/")[1] ?? repo);
  const cleaned = base
    .replace(/-GGUF$/i, "")
    .replace(/[^A-Za-z0-9._:@+-]+/g, "-")
    .replace(/^[^A-Za-z0-9]+/, "");
  return cleaned === "" ? "model" : cleaned.slice(0, 128);
}
