// The check of a profile's engine_args at the door (POST and PATCH /api/v1/models, serve
// and update jobs, `ctl model add`: everything that stores a model goes through the
// catalog, which calls it). An option the engine does not know makes the engine refuse to
// start on every attempt, and the model parks minutes later; here it is a 400 naming the
// item, the engine, and what to do instead.
//
// Which engine runs a llamacpp profile is decided per node, not by the catalog: a node with
// its own llama-server (`llmgw agent --llama-server`) runs every llamacpp profile on it,
// any other node the bundled engine (`llmgw engine`), which takes only the options llmgw
// itself sets. So a llamacpp profile's engine_args are llama-server's options, and a
// profile that passes any runs only on nodes with llama-server, as a GPU profile always
// does: placement skips other nodes (fleet/placement.ts `enginesFor`, from the needs
// fleet/replica-needs.ts marks) and their agents refuse it (engines/engine-launch.ts
// `engineFor`). A CPU profile without engine_args runs on either engine.
//
// What is checked, for llama.cpp:
// - every item is an option of the engine, or the value of the option before it
//   (llama-server refuses anything else: it has no positional arguments);
// - options that take a value have one, a whole number where llama-server reads one
//   (std::stoi), and not the next option by mistake;
// - llama-server's `--name=value` is refused: it reads the value from the next item only
//   (common/arg.cpp `common_params_parse_ex`); long names may use _ for - as it allows;
// - options llmgw sets itself, because the replica's wiring depends on them (weights,
//   address, name, key) or a profile field says them (ctx_size, parallel, embeddings),
//   and options that print and exit instead of serving;
// - on a CPU profile, options that offload layers to a GPU (-ngl): placement gives it no
//   GPU, and llama-server would take memory on GPUs that other replicas hold.
// llama-server's options are those of the llama.cpp node-llama-cpp bundles
// (llama-server/llama-server-options.ts, generated); a node's own build may know others.
// vLLM's options cannot be checked here: they depend on the vLLM version on the node and
// no vLLM runs beside the server, so only the options llmgw sets are refused.
import { BadRequestError } from "../core/errors.ts";
import type { Profile } from "../catalog/model-schema.ts";
import { LLAMA_SERVER_OPTIONS, LLAMA_SERVER_OPTIONS_SOURCE } from "./llama-server/llama-server-options.ts";

type ValueKind = "none" | "int" | "text" | "two";

/** Why engine_args may not set an option, and what to do instead (default: remove it). */
interface Reservation {
  because: string;
  instead?: string;
}

interface EngineOptions {
  /** The engine as messages name it. */
  label: string;
  /** Which build the option list is of, for messages about an option it does not know. */
  build?: string;
  /** Every name the engine's parser takes (negated ones too), with the option's first name and value. */
  byName: ReadonlyMap<string, { first: string; value: ValueKind }>;
  /** Options llmgw sets, by any of their names. */
  reserved: ReadonlyMap<string, Reservation>;
  /** Whether `--name=value` gives the value (vLLM's argparse does, llama-server does not). */
  equalsForm: boolean;
  /** Whether options it does not know are refused (false for vLLM, whose options are not known here). */
  closed: boolean;
  /** The name as the engine's parser looks it up. */
  normalise(name: string): string;
}

const WEIGHTS: Reservation = { because: "llmgw passes the model's weights from the catalog's source, and a replica loads nothing else" };
const ADDRESS: Reservation = { because: "llmgw binds each replica to its node's address and a free port, where the gateway reaches it" };
const SERVED_NAME: Reservation = { because: "llmgw serves the model under its catalog name, which the gateway asks for" };
const ENGINE_KEY: Reservation = { because: "llmgw gives each replica its own engine key through the environment, and the gateway sends that key" };
const PRINTS_AND_EXITS: Reservation = { because: "it makes the engine print something and exit instead of serving" };
const PLAIN_HTTP: Reservation = { because: "the gateway reaches the engine over plain HTTP, at the root of its address (/health, /v1)" };
const PROJECTOR: Reservation = { because: "llmgw passes the vision projector that was mirrored with the weights" };
const GPU_OFFLOAD: Reservation = {
  because: "a profile without hardware.gpu is given no GPU, and the GPUs of its node belong to other replicas",
  instead: "Set hardware.gpu in the profile to run it on GPUs.",
};
const fromField = (field: string, flag = ""): Reservation => ({
  because: `llmgw sets it from the profile's ${field}`,
  instead: `Set ${field}${flag} in the profile instead.`,
});

/** Each name of each group of option names, mapped to why engine_args may not set it. */
function reservations(entries: ReadonlyArray<[readonly string[], Reservation]>): Map<string, Reservation> {
  const map = new Map<string, Reservation>();
  for (const [names, reservation] of entries) for (const name of names) map.set(name, reservation);
  return map;
}

function namesOf(
  options: ReadonlyArray<{ names: readonly string[]; negated?: readonly string[]; value: ValueKind }>,
): Map<string, { first: string; value: ValueKind }> {
  const map = new Map<string, { first: string; value: ValueKind }>();
  for (const option of options) {
    const first = option.names[0] as string;
    for (const name of [...option.names, ...(option.negated ?? [])]) if (!map.has(name)) map.set(name, { first, value: option.value });
  }
  return map;
}

const LLAMA_SERVER: EngineOptions = {
  label: "llama-server",
  build: `llama.cpp ${LLAMA_SERVER_OPTIONS_SOURCE.release}, ${LLAMA_SERVER_OPTIONS_SOURCE.commit.slice(0, 7)}`,
  byName: namesOf(LLAMA_SERVER_OPTIONS),
  // engines/llama-server/llama-server-launch.ts sets -m, --host, --port, --alias, --ctx-size,
  // --parallel, --mmproj, --embedding and the key (LLAMA_API_KEY); -ngl and -fa it sets too,
  // but on purpose lets engine_args choose them (they come last, and llama.cpp keeps the last;
  // -ngl only on a GPU profile, see LLAMA_SERVER_ON_CPU).
  reserved: reservations([
    [["-m", "--model", "-mu", "--model-url", "-hf", "-hfr", "--hf-repo", "-hff", "--hf-file", "-dr", "--docker-repo", "-hft", "--hf-token"], WEIGHTS],
    [["--host", "--port"], ADDRESS],
    [["-a", "--alias"], SERVED_NAME],
    [["--api-key", "--api-key-file"], ENGINE_KEY],
    [["--api-prefix", "--ssl-key-file", "--ssl-cert-file"], PLAIN_HTTP],
    [["-mm", "--mmproj", "-mmu", "--mmproj-url"], PROJECTOR],
    [["-c", "--ctx-size"], fromField("ctx_size")],
    [["-np", "--parallel"], fromField("parallel")],
    [["--embedding", "--embeddings"], fromField("embeddings", ": true")],
    [["-h", "--help", "--usage", "--version", "-cl", "--cache-list", "--completion-bash", "--list-devices"], PRINTS_AND_EXITS],
  ]),
  equalsForm: false,
  closed: true,
  // common/arg.cpp: "--" names have their _ turned into - before the lookup.
  normalise: (name) => (name.startsWith("--") ? name.replaceAll("_", "-") : name),
};

/** llama-server running a CPU profile: as for a GPU one, but it may not offload layers to a GPU. */
const LLAMA_SERVER_ON_CPU: EngineOptions = {
  ...LLAMA_SERVER,
  reserved: new Map([
    ...LLAMA_SERVER.reserved,
    ...reservations([[["-ngl", "--gpu-layers", "--n-gpu-layers", "--spec-draft-ngl", "-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft"], GPU_OFFLOAD]]),
  ]),
};

const VLLM: EngineOptions = {
  label: "vLLM",
  byName: new Map(),
  // engines/vllm/vllm-launch.ts sets these (the key through VLLM_API_KEY).
  reserved: reservations([
    [["--model"], WEIGHTS],
    [["--host", "--port"], ADDRESS],
    [["--served-model-name"], SERVED_NAME],
    [["--api-key"], ENGINE_KEY],
    [["-tp", "--tensor-parallel-size"], fromField("hardware.gpu.gpus_per_node")],
    [["-pp", "--pipeline-parallel-size"], fromField("hardware.gpu.nodes")],
    [["--max-model-len"], fromField("ctx_size")],
  ]),
  equalsForm: true,
  closed: false,
  // vLLM's parser turns _ into - in long names, and `--name.key` sets one key of a JSON option.
  normalise: (name) => {
    const base = name.replace(/(?<=^-+[^.]+)\..*$/, "");
    return base.startsWith("--") ? base.replaceAll("_", "-") : base;
  },
};

/** One problem in a profile's engine_args: the item it is about and what to do. */
export interface EngineArgsProblem {
  index: number;
  message: string;
}

type ProfileArgs = Pick<Profile, "engine" | "engine_args" | "hardware">;

/** The engine that takes a profile's engine_args (see the module comment); null for an external profile. */
function engineOf(profile: ProfileArgs): EngineOptions | null {
  if (profile.engine === "llamacpp") return profile.hardware.gpu === undefined ? LLAMA_SERVER_ON_CPU : LLAMA_SERVER;
  if (profile.engine === "vllm") return VLLM;
  return null;
}

/** Said after any problem in a CPU profile's engine_args, whose authors may think of the bundled engine. */
const CPU_PROFILE_NOTE =
  "A llamacpp profile's engine_args are llama-server options: a profile without hardware.gpu that passes any runs only on nodes with llama-server (llmgw agent --llama-server), one without engine_args on any node.";

interface Lookup {
  engine: EngineOptions;
  option: { first: string; value: ValueKind } | undefined;
  /** The item was `--name=value`. */
  inline: boolean;
}

function lookup(engine: EngineOptions, arg: string): Lookup {
  const option = engine.byName.get(engine.normalise(arg));
  if (option !== undefined || engine.reserved.has(engine.normalise(arg))) return { engine, option, inline: false };
  const equals = arg.indexOf("=");
  if (equals > 0) {
    const name = engine.normalise(arg.slice(0, equals));
    const named = engine.byName.get(name);
    if (named !== undefined || engine.reserved.has(name)) return { engine, option: named, inline: true };
  }
  return { engine, option: undefined, inline: false };
}

function reservationOf(found: Lookup, arg: string): Reservation | undefined {
  const name = found.engine.normalise(found.inline ? arg.slice(0, arg.indexOf("=")) : arg);
  return found.engine.reserved.get(name);
}

/** The first problem in a profile's engine_args, or null when the engine that runs it takes them all. */
export function engineArgsProblem(profile: ProfileArgs): EngineArgsProblem | null {
  const args = profile.engine_args;
  if (args.length === 0) return null;
  const engine = engineOf(profile);
  if (engine === null) {
    return { index: 0, message: "An external profile starts no engine, so engine_args have nothing to go to. Remove them." };
  }
  const problem = engine.closed ? closedProblem(args, engine) : openProblem(args, engine);
  if (problem === null || engine !== LLAMA_SERVER_ON_CPU) return problem;
  return { index: problem.index, message: `${problem.message} ${CPU_PROFILE_NOTE}` };
}

/** An engine whose options are all known (llama-server): each item is one of them or its value. */
function closedProblem(args: readonly string[], engine: EngineOptions): EngineArgsProblem | null {
  for (let index = 0; index < args.length; ) {
    const arg = args[index] as string;
    if (!arg.startsWith("-") || arg === "-") {
      return {
        index,
        message: `'${arg}' is not an option, and no option before it takes a value; ${engine.label} takes no other arguments. Put each option before its value, or remove it.`,
      };
    }
    const found = lookup(engine, arg);
    const reservation = reservationOf(found, arg);
    if (reservation !== undefined) return { index, message: reservedMessage({ arg, reservation, entry: found }) };
    if (found.option === undefined) return { index, message: unknownMessage(arg, engine) };
    const problem = valueProblem({ args, index, found });
    if (problem !== null) return problem;
    index += 1 + (found.inline ? 0 : valueCount(found.option.value));
  }
  return null;
}

/** An engine whose options are not known here (vLLM): only the options llmgw sets are refused. */
function openProblem(args: readonly string[], engine: EngineOptions): EngineArgsProblem | null {
  for (const [index, arg] of args.entries()) {
    if (!arg.startsWith("-")) continue;
    const entry = lookup(engine, arg);
    const reservation = reservationOf(entry, arg);
    if (reservation !== undefined) return { index, message: reservedMessage({ arg, reservation, entry }) };
  }
  return null;
}

function valueCount(kind: ValueKind): number {
  return kind === "none" ? 0 : kind === "two" ? 2 : 1;
}

function valueProblem(options: { args: readonly string[]; index: number; found: Lookup }): EngineArgsProblem | null {
  const { args, index, found } = options;
  const arg = args[index] as string;
  const { engine } = found;
  const kind = found.option?.value ?? "none";
  if (found.inline) {
    const name = arg.slice(0, arg.indexOf("="));
    if (kind === "none") return { index, message: `'${name}' is a switch on ${engine.label} and takes no value, got '${arg}'. Give '${name}' alone.` };
    if (!engine.equalsForm) {
      return {
        index,
        message: `${engine.label} reads an option's value from the next item only and refuses '${arg}'. Give '${name}' and '${arg.slice(name.length + 1)}' as two items of engine_args.`,
      };
    }
    return null;
  }
  const count = valueCount(kind);
  for (let offset = 1; offset <= count; offset += 1) {
    const value = args[index + offset];
    const needs = count === 2 ? "two values (the next two items)" : "a value (the next item)";
    if (value === undefined) return { index, message: `'${arg}' needs ${needs} on ${engine.label}, and engine_args end after it. Add the value.` };
    if (engine.byName.has(engine.normalise(value))) {
      return { index, message: `'${arg}' needs ${needs} on ${engine.label}, but the next item is the option '${value}'. Add the value after '${arg}'.` };
    }
    // llama-server reads whole numbers with std::stoi: optional blanks and sign, then digits.
    if (kind === "int" && !/^\s*[+-]?\d/.test(value)) {
      return { index: index + offset, message: `'${arg}' takes a whole number on ${engine.label}, got '${value}'. Give a number.` };
    }
  }
  return null;
}

function reservedMessage(options: { arg: string; reservation: Reservation; entry: Lookup }): string {
  const { arg, reservation, entry } = options;
  const name = entry.inline ? arg.slice(0, arg.indexOf("=")) : arg;
  const readAs = entry.engine.normalise(name);
  const shown = readAs === name ? `'${arg}'` : `'${arg}' (read as ${readAs})`;
  return `${shown} cannot be set in engine_args: ${reservation.because}. ${reservation.instead ?? "Remove it."}`;
}

function unknownMessage(arg: string, engine: EngineOptions): string {
  const name = arg.includes("=") ? arg.slice(0, arg.indexOf("=")) : arg;
  const of = `${engine.label}${engine.build === undefined ? "" : ` (${engine.build})`}`;
  const close = closestName(name, engine);
  if (close === null) return `'${name}' is not an option of ${of}. Correct or remove it.`;
  const reserved = engine.reserved.get(close);
  const then = reserved === undefined ? "" : ` That one cannot be set in engine_args either: ${reserved.because}. ${reserved.instead ?? "Remove it."}`;
  return `'${name}' is not an option of ${of}; did you mean '${close}'?${then}`;
}

/** The known name closest to `name` when it is a few edits away (a typo), or null. */
function closestName(name: string, engine: EngineOptions): string | null {
  let best: { name: string; distance: number } | null = null;
  for (const candidate of engine.byName.keys()) {
    const distance = editDistance(name, candidate);
    if (best === null || distance < best.distance) best = { name: candidate, distance };
  }
  // A typo is a few edits; past that the closest name is noise, not a hint.
  const allowed = Math.min(3, Math.max(1, Math.floor(name.length / 4)));
  return best !== null && best.distance <= allowed ? best.name : null;
}

/** Edit distance counting an insertion, deletion, substitution or swap of neighbours as one edit (optimal string alignment). */
function editDistance(a: string, b: string): number {
  const d = Array.from({ length: a.length + 1 }, (_, i) => Array.from({ length: b.length + 1 }, (_, j) => (i === 0 ? j : j === 0 ? i : 0)));
  const at = (i: number, j: number): number => (d[i] as number[])[j] as number;
  for (let i = 1; i <= a.length; i += 1) {
    for (let j = 1; j <= b.length; j += 1) {
      let best = Math.min(at(i - 1, j) + 1, at(i, j - 1) + 1, at(i - 1, j - 1) + (a[i - 1] === b[j - 1] ? 0 : 1));
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) best = Math.min(best, at(i - 2, j - 2) + 1);
      (d[i] as number[])[j] = best;
    }
  }
  return at(a.length, b.length);
}

/** Refuses a model whose profiles' engine_args their engine would refuse: a 400 naming the item. */
export function assertEngineArgs(profiles: readonly ProfileArgs[]): void {
  for (const [profileIndex, profile] of profiles.entries()) {
    const problem = engineArgsProblem(profile);
    if (problem === null) continue;
    const param = `profiles.${profileIndex}.engine_args.${problem.index}`;
    throw new BadRequestError(`Invalid model: field '${param}': ${problem.message}`, { code: "invalid_engine_args", param });
  }
}
