// Request bodies built from `llmgw ctl model` flags: `model add` (a GGUF file, a mirrored
// file, an external server or a JSON definition), `model edit --patch`, and `model serve`
// (the serve job's snake_case body of notes/serve-api.md). Flags that contradict each other
// are refused here, before anything is sent, with one line that says which to keep.
// Local paths travel absolute: ctl runs in the user's folder, the server in its own.
import { readFileSync } from "node:fs";
import path from "node:path";
import { BadRequestError, describeError } from "../core/errors.ts";
import { parsePositiveInt } from "./config.ts";
import type { CtlOptions as Options } from "./ctl-common.ts";
import { absoluteFilePath, absoluteRepoArgument } from "./local-paths.ts";

const SERVE_FORMATS = ["gguf", "safetensors"] as const;
const GUARD_FORMATS = ["llamaguard3", "shieldgemma", "json"] as const;

/** The body of `POST /api/v1/jobs/serve`. */
export interface ServeRequestBody {
  repo: string;
  revision?: string;
  quant?: string;
  file?: string;
  format?: (typeof SERVE_FORMATS)[number];
  projector?: string | true;
  hardware?: { cpu: { cores?: number } } | { gpu: { class: string; gpus_per_node: number; nodes: number } };
  fallbacks?: boolean;
  name?: string;
  aliases?: string[];
  replicas?: number;
  guard_format?: (typeof GUARD_FORMATS)[number];
  ctx_pool?: number;
  context?: number;
  adapters?: ServeAdapterBody[];
}

/** A LoRA adapter of the serve body: a GGUF file of a registry repository, served as MODEL:NAME. */
export interface ServeAdapterBody {
  repo: string;
  revision?: string;
  file?: string;
  name?: string;
}

/**
 * `ctl model serve REPO` flags (commander's camelCase options) → the serve job's body.
 * Only what was given is sent: the server's defaults (one replica, the plan's pick) stay
 * the server's.
 */
export function serveBodyFromFlags(repo: string, options: Options): ServeRequestBody {
  const given = (name: string) => options[name] !== undefined && options[name] !== false;
  if (given("quant") && given("file")) {
    throw new BadRequestError("Give --quant or --file, not both: --quant picks a quantisation of the repository, --file names one exact file of it.");
  }
  if (given("replicas") && given("onDemand")) {
    throw new BadRequestError(
      "Give --replicas N or --on-demand, not both: --on-demand is --replicas 0 (a replica starts at the first request and stops when idle).",
    );
  }
  if (given("cpu") && given("gpuClass")) {
    throw new BadRequestError("Give --cpu or --gpu-class C, not both: --cpu runs the model on CPU cores, --gpu-class on GPUs of that class.");
  }
  if ((given("gpusPerNode") || given("nodes")) && !given("gpuClass")) {
    throw new BadRequestError(
      "--gpus-per-node and --nodes size a GPU placement: add --gpu-class C (e.g. --gpu-class h100), or leave them out to let the plan choose.",
    );
  }
  const body: ServeRequestBody = { repo: absoluteRepoArgument(repo) };
  const text = (name: string) => (typeof options[name] === "string" ? (options[name] as string) : undefined);
  const revision = text("revision");
  if (revision !== undefined) body.revision = revision;
  const quant = text("quant");
  if (quant !== undefined) body.quant = quant;
  const file = text("file");
  if (file !== undefined) body.file = file;
  const format = text("format");
  if (format !== undefined) body.format = oneOf(format, SERVE_FORMATS, "--format");
  // `--projector` alone asks for the repository's projector; `--projector FILE` names one.
  if (options.projector === true || typeof options.projector === "string") body.projector = options.projector;
  const gpuClass = text("gpuClass");
  if (gpuClass !== undefined) {
    body.hardware = {
      gpu: {
        class: gpuClass,
        gpus_per_node: given("gpusPerNode") ? parsePositiveInt(String(options.gpusPerNode), "--gpus-per-node") : 1,
        nodes: given("nodes") ? parsePositiveInt(String(options.nodes), "--nodes") : 1,
      },
    };
  } else if (options.cpu === true) {
    body.hardware = { cpu: {} };
  }
  if (options.fallbacks === true) body.fallbacks = true;
  const name = text("name");
  if (name !== undefined) body.name = name;
  if (Array.isArray(options.alias) && options.alias.length > 0) body.aliases = options.alias as string[];
  if (options.onDemand === true) body.replicas = 0;
  else if (given("replicas")) body.replicas = parsePositiveInt(String(options.replicas), "--replicas", { allowZero: true });
  const guardFormat = text("guardFormat");
  if (guardFormat !== undefined) body.guard_format = oneOf(guardFormat, GUARD_FORMATS, "--guard-format");
  if (given("ctxPool")) body.ctx_pool = parsePositiveInt(String(options.ctxPool), "--ctx-pool");
  if (given("context")) body.context = parsePositiveInt(String(options.context), "--context");
  if (Array.isArray(options.adapter) && options.adapter.length > 0) body.adapters = (options.adapter as string[]).map(serveAdapterFromFlag);
  return body;
}

/**
 * `--adapter [NAME=]REPO[@REVISION][:FILE]` of `model serve`: a repository id goes as it is
 * (the server reads it from the registry); the name defaults on the server to the
 * repository's, the file to the repository's only .gguf. Repository ids and git revisions
 * cannot hold '=' or ':', so the parts never mix.
 */
export function serveAdapterFromFlag(value: string): ServeAdapterBody {
  const usage = `--adapter takes [NAME=]REPO[@REVISION][:FILE] (for example style=owner/style-lora-GGUF:style.gguf), got '${value}'.`;
  const equals = value.indexOf("=");
  const name = equals === -1 ? undefined : value.slice(0, equals);
  const rest = equals === -1 ? value : value.slice(equals + 1);
  const colon = rest.indexOf(":");
  const where = colon === -1 ? rest : rest.slice(0, colon);
  const file = colon === -1 ? undefined : rest.slice(colon + 1);
  const at = where.indexOf("@");
  const repo = at === -1 ? where : where.slice(0, at);
  const revision = at === -1 ? undefined : where.slice(at + 1);
  if (name === "" || repo === "" || file === "" || revision === "") throw new BadRequestError(usage, { param: "adapter" });
  return {
    repo,
    ...(revision === undefined ? {} : { revision }),
    ...(file === undefined ? {} : { file }),
    ...(name === undefined ? {} : { name }),
  };
}

function oneOf<const T extends string>(value: string, allowed: readonly T[], flag: string): T {
  if ((allowed as readonly string[]).includes(value)) return value as T;
  throw new BadRequestError(`Invalid ${flag} '${value}': use ${allowed.slice(0, -1).join(", ")} or ${allowed.at(-1)}.`);
}

/** `ctl model add` flags → the model definition of `POST /api/v1/models`. */
/** `--adapter NAME=FILE`: a LoRA adapter file on this machine (made absolute), served as MODEL:NAME. */
function adapterFromFlag(value: string): { name: string; source: { kind: "file"; path: string } } {
  const equals = value.indexOf("=");
  if (equals <= 0 || equals === value.length - 1) {
    throw new BadRequestError(`--adapter takes NAME=FILE (the adapter's short name and its GGUF file), got '${value}'.`, { param: "adapter" });
  }
  return { name: value.slice(0, equals), source: { kind: "file", path: absoluteFilePath(value.slice(equals + 1)) } };
}

export function modelFromFlags(name: string | undefined, options: Options): unknown {
  if (typeof options.definition === "string") {
    const fromStdin = options.definition === "-";
    const text = fromStdin ? readFileSync(0, "utf8") : readFileSync(options.definition, "utf8");
    const definition = parseJsonText(text, `--definition ${options.definition}`);
    // A relative weights path in a definition file means next to that file (stdin: here).
    return withAbsoluteFileSource(definition, fromStdin ? process.cwd() : path.dirname(path.resolve(options.definition)));
  }
  if (name === undefined) throw new BadRequestError("Give the model a name: 'llmgw ctl model add NAME --gguf FILE' (or use --definition FILE).");
  const aliases = Array.isArray(options.alias) ? (options.alias as string[]) : [];
  const replicas = typeof options.replicas === "string" ? parsePositiveInt(options.replicas, "--replicas", { allowZero: true }) : 1;
  const scaling = { min: replicas, max: Math.max(replicas, 1) };
  if (typeof options.gguf === "string" || typeof options.mirror === "string") {
    return {
      name,
      aliases,
      scaling,
      source: typeof options.gguf === "string" ? { kind: "file", path: absoluteFilePath(options.gguf) } : mirrorSource(options.mirror as string),
      ...(Array.isArray(options.adapter) ? { adapters: (options.adapter as string[]).map(adapterFromFlag) } : {}),
      profiles: [
        {
          name: "cpu",
          engine: "llamacpp",
          ...(typeof options.ctxSize === "string" ? { ctx_size: parsePositiveInt(options.ctxSize, "--ctx-size") } : {}),
          ...(typeof options.parallel === "string" ? { parallel: parsePositiveInt(options.parallel, "--parallel") } : {}),
        },
      ],
    };
  }
  if (typeof options.external === "string") {
    return {
      name,
      aliases,
      profiles: [
        {
          name: "external",
          engine: "external",
          url: options.external,
          ...(typeof options.apiKey === "string" ? { api_key: options.apiKey } : {}),
          ...(typeof options.upstreamModel === "string" ? { upstream_model: options.upstreamModel } : {}),
        },
      ],
    };
  }
  throw new BadRequestError("Say what serves the model: --gguf FILE, --mirror MODEL/VERSION/FILE, --external URL, or --definition FILE.");
}

/** `--patch JSON|@file` → the patch, with a relative weights path made absolute: from here (inline JSON), or next to the @file. */
export function patchFromArgument(argument: string): unknown {
  const base = argument.startsWith("@") ? path.dirname(path.resolve(argument.slice(1))) : process.cwd();
  const text = argument.startsWith("@") ? readFileSync(argument.slice(1), "utf8") : argument;
  return withAbsoluteFileSource(parseJsonText(text, "--patch"), base);
}

/** The definition with a relative `source.path` of a file source made absolute against `base`. */
function withAbsoluteFileSource(definition: unknown, base: string): unknown {
  if (typeof definition !== "object" || definition === null) return definition;
  const source = (definition as { source?: unknown }).source;
  if (typeof source !== "object" || source === null) return definition;
  const { kind, path: file } = source as { kind?: unknown; path?: unknown };
  if (kind !== "file" || typeof file !== "string" || file === "") return definition;
  return { ...definition, source: { ...source, path: absoluteFilePath(file, base) } };
}

/** `model/version/file` (the file may have folders) → a mirror source. */
function mirrorSource(value: string): { kind: "mirror"; model: string; version: string; file: string } {
  const [model, version, ...file] = value.split("/");
  if (model === undefined || version === undefined || file.length === 0 || file.some((part) => part === "")) {
    throw new BadRequestError(`Invalid --mirror '${value}': use MODEL/VERSION/FILE as 'llmgw ctl mirror list' shows them.`);
  }
  return { kind: "mirror", model, version, file: file.join("/") };
}

function parseJsonText(text: string, what: string): unknown {
  try {
    return JSON.parse(text);
  } catch (error) {
    throw new BadRequestError(`${what} is not valid JSON: ${describeError(error)}.`);
  }
}
