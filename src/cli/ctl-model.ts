// `llmgw ctl model ...`: the catalog over the admin API. Plain catalog edits (list, show,
// add, edit, remove, unpark, scale) are one call or two; `serve`, `update` and `rollback`
// start a job on the server and follow it (ctl-job.ts) unless told --detach; `plan` and
// `check-updates` ask the server what a repository needs and which models have a newer
// revision. The flags-to-body work lives in ctl-model-flags.ts.
import type { Command } from "commander";
import { BadRequestError } from "../core/errors.ts";
import { countOf, formatBytes } from "../core/format.ts";
import { DEFAULT_CONTEXT_POOL } from "../catalog/model-schema.ts";
import { renderPlanTable } from "../plan/render.ts";
import type { ModelPlan } from "../plan/plan.ts";
import { parsePositiveInt } from "./config.ts";
import { type CtlHelpers, type CtlOptions as Options, wantsJson, withExamples } from "./ctl-common.ts";
import { type JobView, followStartedJob } from "./ctl-job.ts";
import { modelFromFlags, patchFromArgument, serveBodyFromFlags } from "./ctl-model-flags.ts";
import { type ModelHealthView, renderModelHealth } from "./ctl-node.ts";
import { absoluteRepoArgument } from "./local-paths.ts";
import { renderTable } from "./output.ts";

/** Length of a revision in tables: enough to tell commits apart, as the mirror names versions. */
const SHORT_REVISION = 12;

interface OriginFile {
  path: string;
  sha256: string;
  bytes: number;
}

/** Where a served model's weights came from (`origin` of GET /api/v1/models/:name). */
interface ModelOrigin {
  repo: string;
  revision: string;
  files: OriginFile[];
  previous?: { revision: string; files: OriginFile[]; source: unknown };
}

/** What ctl reads of a model as the admin API shows it (GET, POST and PATCH /api/v1/models). */
interface ModelView {
  name: string;
  aliases: string[];
  profiles: Array<{ engine: string }>;
  health: { state: string; ready: number; replicas: number; reason: string | null };
}

/** The answer to GET /api/v1/plan: a repository's artifacts and the plan for them. */
interface RepositoryPlan {
  repo: string;
  revision: string;
  sha: string;
  artifacts: Array<{ description: string; planned: boolean; note?: string }>;
  plan: ModelPlan;
}

interface UpdateCheck {
  model: string;
  repo: string;
  revision: string;
  latest_revision: string | null;
  update_available: boolean;
  checked_at: string | null;
  error: string | null;
}

/** How a model's requests pick a replica, as GET /api/v1/models/NAME shows it. */
interface RoutingView {
  routing?: string;
  prefix?: { chars: number | string; load_factor: number | string };
}

/** One line on how the gateway picks a replica of the model. */
export function renderRouting(model: RoutingView): string {
  if (model.routing !== "prefix") return "routing: least-busy (the replica with the fewest requests in flight)";
  // The API shows a prefix-routed model's settings with their defaults filled in.
  const { chars, load_factor: loadFactor } = model.prefix ?? { chars: "the default number of", load_factor: "the default factor" };
  return `routing: prefix (a conversation's first ${chars} characters pick its replica; one above ${loadFactor} × the mean requests in flight is passed over)`;
}

export function registerModelCommands(ctl: Command, helpers: CtlHelpers): void {
  const { connect, print } = helpers;
  const model = ctl.command("model").description("Models in the catalog");
  const path = (name: string, suffix = "") => `/api/v1/models/${encodeURIComponent(name)}${suffix}`;

  withExamples(model.command("list"), "llmgw ctl model list")
    .description("Models with their aliases, engines, state and ready replicas")
    .option("--json", "print JSON")
    .action(async (_options: Options, command: Command) => {
      const { data } = await connect(command).call<{ data: ModelView[] }>("GET", "/api/v1/models");
      print(command, data, () =>
        data.length === 0
          ? "No models yet. Serve one with 'llmgw ctl model serve OWNER/NAME', or add one with 'llmgw ctl model add NAME --gguf FILE' or '--external URL'."
          : renderTable(
              ["NAME", "ALIASES", "ENGINES", "STATE", "READY", "REASON"],
              data.map((m) => [
                m.name,
                m.aliases.join(",") || null,
                m.profiles.map((p) => p.engine).join(","),
                m.health.state,
                `${m.health.ready}/${m.health.replicas}`,
                m.health.reason,
              ]),
            ),
      );
    });

  withExamples(model.command("show <name>"), "llmgw ctl model show tiny-llama")
    .description(
      "Show a model's health (replicas by state and node, parking, failures, last error, placement explanation) and where its weights came from (--json: the whole model)",
    )
    .option("--json", "print the model with its profiles, health, replicas and origin as JSON")
    .action(async (name: string, _options: Options, command: Command) => {
      const client = connect(command);
      if (wantsJson(command)) {
        process.stdout.write(`${JSON.stringify(await client.call("GET", path(name)), null, 2)}\n`);
        return;
      }
      const [health, shown] = await Promise.all([
        client.call<ModelHealthView>("GET", path(name, "/health")),
        client.call<{ origin?: ModelOrigin; adapters?: ShownAdapter[]; source?: { projector?: string } } & RoutingView>("GET", path(name)),
      ]);
      const routing = ["", renderRouting(shown)];
      const origin = shown.origin === undefined ? [] : ["", renderOrigin(name, shown.origin)];
      const projector = shown.source?.projector === undefined ? [] : ["", `vision projector: ${shown.source.projector}`];
      const adapters = shown.adapters === undefined || shown.adapters.length === 0 ? [] : ["", renderAdapters(name, shown.adapters)];
      process.stdout.write(`${[renderModelHealth(health), ...routing, ...projector, ...adapters, ...origin].join("\n")}\n`);
    });

  withExamples(
    model.command("add [name]"),
    "llmgw ctl model add tiny --gguf ./models/tiny.gguf --alias small",
    "llmgw ctl model add gpt-proxy --external http://10.0.0.5:8000/v1 --upstream-model Qwen2.5-7B",
  )
    .description("Add a model: a local GGUF file, an external OpenAI-compatible server, or a full JSON definition")
    .option("--gguf <file>", "serve this GGUF file with the bundled llama.cpp")
    .option("--mirror <model/version/file>", "serve a GGUF file from the mirror (see 'llmgw ctl mirror list')")
    .option("--external <url>", "route to an existing OpenAI-compatible server (base URL)")
    .option("--api-key <key>", "key of the external server")
    .option("--upstream-model <name>", "model name the external server expects")
    .option("--alias <alias...>", "other names for the model")
    .option("--replicas <n>", "replicas to keep running (default 1)")
    .option("--ctx-size <n>", "llama.cpp context shared by parallel requests")
    .option("--parallel <n>", "llama.cpp requests served at once")
    .option("--definition <file>", "JSON model definition ('-' for stdin); a relative source.path is relative to that file")
    .option("--adapter <name=file...>", "a LoRA adapter GGUF served as NAME:ADAPTER (repeatable; with --gguf or --mirror)")
    .option("--json", "print JSON")
    .action(async (name: string | undefined, options: Options, command: Command) => {
      const created = await connect(command).call<ModelView>("POST", "/api/v1/models", modelFromFlags(name, options));
      print(command, created, () => `Added model '${created.name}' (${created.health.state}${created.health.reason ? `: ${created.health.reason}` : ""}).`);
    });

  withExamples(
    model.command("edit <name>"),
    `llmgw ctl model edit tiny --patch '{"aliases": ["small"], "queue_size": 32}'`,
    "llmgw ctl model edit tiny --patch @change.json",
  )
    .description("Change a model with a JSON patch (fields to change; profiles are replaced as a list)")
    .requiredOption("--patch <json>", "JSON object, or @file to read one")
    .option("--json", "print JSON")
    .action(async (name: string, options: Options, command: Command) => {
      const updated = await connect(command).call<ModelView>("PATCH", path(name), patchFromArgument(String(options.patch)));
      print(command, updated, () => `Changed model '${updated.name}'.`);
    });

  withExamples(
    model.command("serve <repo>"),
    "llmgw ctl model serve llmgw-test/tiny-llama-GGUF --quant Q4_K_M",
    "llmgw ctl model serve ./models/qwen --gpu-class h100 --gpus-per-node 2 --name qwen --detach",
    "llmgw ctl model serve owner/base-GGUF --adapter owner/style-lora-GGUF --adapter terse=owner/terse-lora:terse-f16.gguf",
  )
    .description(
      "Serve a repository (owner/name, or a local file or folder) in one job: pick the artifact, mirror and check it, add it to the catalog, place it and smoke-test it",
    )
    .option("--revision <rev>", "branch, tag or commit (default main)")
    .option("--quant <label>", "GGUF quantisation, e.g. Q4_K_M (default: what the plan recommends)")
    .option("--file <path>", "an exact file of the repository")
    .option("--format <format>", "gguf or safetensors")
    .option("--projector [file]", "also serve the vision projector (the repository's, or this file of it)")
    .option("--cpu", "run on CPU cores")
    .option("--gpu-class <class>", "run on GPUs of this class, e.g. h100")
    .option("--gpus-per-node <n>", "GPUs per node, with --gpu-class (default 1)")
    .option("--nodes <n>", "nodes per replica, with --gpu-class (default 1)")
    .option("--fallbacks", "also add the plan's fallback profiles (e.g. CPU when no GPU has room)")
    .option("--name <name>", "the catalog name (default: from the repository)")
    .option("--alias <alias...>", "other names for the model")
    .option("--replicas <n>", "replicas to keep running (default 1)")
    .option("--on-demand", "no replica until the first request; it stops when idle")
    .option("--guard-format <format>", "serve it as a guard model: llamaguard3, shieldgemma or json")
    .option("--ctx-pool <n>", "context (tokens) shared by a replica's parallel requests")
    .option("--context <n>", "context (tokens) of one request")
    .option(
      "--adapter <repo...>",
      "also serve a LoRA adapter GGUF from a repository as NAME:ADAPTER, given as [ADAPTER=]OWNER/REPO[@REVISION][:FILE] (repeatable; FILE defaults to the repository's only .gguf, ADAPTER to the repository's name)",
    )
    .option("--detach", "start the job and print its id alone on stdout; follow it with 'llmgw ctl job watch ID'")
    .option("--json", "print the finished job as JSON (with --detach: the started one)")
    .action(async (repo: string, options: Options, command: Command) => {
      const body = serveBodyFromFlags(repo, options);
      const client = connect(command);
      const started = await client.call<JobView>("POST", "/api/v1/jobs/serve", body);
      await followStartedJob({ helpers, command, client, started, detach: options.detach === true });
    });

  withExamples(model.command("update <name>"), "llmgw ctl model update tiny-llama", "llmgw ctl model update tiny-llama --revision 1a2b3c4d5e6f --detach")
    .description("Move a served model to a newer revision of its repository in one job: mirror, check, roll out, smoke-test, retire the old replicas")
    .option("--revision <rev>", "branch, tag or commit (default: the latest of the revision it follows)")
    .option("--detach", "start the job and print its id alone on stdout; follow it with 'llmgw ctl job watch ID'")
    .option("--json", "print the finished job as JSON (with --detach: the started one)")
    .action(async (name: string, options: Options, command: Command) => {
      const client = connect(command);
      const started = await client.call<JobView>("POST", "/api/v1/jobs/update", {
        model: name,
        ...(typeof options.revision === "string" ? { revision: options.revision } : {}),
      });
      await followStartedJob({ helpers, command, client, started, detach: options.detach === true });
    });

  withExamples(model.command("rollback <name>"), "llmgw ctl model rollback tiny-llama")
    .description("Go back to the revision a model served before its last update, in one job")
    .option("--detach", "start the job and print its id alone on stdout; follow it with 'llmgw ctl job watch ID'")
    .option("--json", "print the finished job as JSON (with --detach: the started one)")
    .action(async (name: string, options: Options, command: Command) => {
      const client = connect(command);
      const started = await client.call<JobView>("POST", path(name, "/rollback"));
      await followStartedJob({ helpers, command, client, started, detach: options.detach === true });
    });

  withExamples(model.command("check-updates [name]"), "llmgw ctl model check-updates", "llmgw ctl model check-updates tiny-llama --json")
    .description("Ask the registry now whether served models (or one) have a newer revision")
    .option("--json", "print JSON")
    .action(async (name: string | undefined, _options: Options, command: Command) => {
      const { data } = await connect(command).call<{ data: UpdateCheck[] }>("POST", "/api/v1/updates/check", name === undefined ? {} : { model: name });
      print(command, data, () => renderUpdateChecks(data));
    });

  withExamples(
    model.command("scale <name> [replicas]"),
    "llmgw ctl model scale tiny-llama 3",
    "llmgw ctl model scale tiny-llama 1 --max 4",
    "llmgw ctl model scale tiny-llama --on-demand --max 3 --target 8",
  )
    .description("Keep N replicas running, or run on demand (no replica until a request; it stops when idle); with --max, scale up to that many on load")
    .option("--on-demand", "run on demand instead of a fixed number")
    .option("--max <replicas>", "autoscale: add replicas up to this many while requests queue, and drain them when the load falls")
    .option("--target <requests>", "autoscaling's requests in flight and queued per replica (default: the replica's parallel)")
    .option("--json", "print JSON")
    .action(async (name: string, replicas: string | undefined, options: Options, command: Command) => {
      const onDemand = options.onDemand === true;
      if (onDemand === (replicas !== undefined)) {
        throw new BadRequestError(
          `Give a number of replicas or --on-demand: 'llmgw ctl model scale ${name} 2' or 'llmgw ctl model scale ${name} --on-demand'.`,
        );
      }
      const client = connect(command);
      const max = typeof options.max === "string" ? parsePositiveInt(options.max, "--max") : undefined;
      const target = typeof options.target === "string" ? parsePositiveInt(options.target, "--target") : undefined;
      let scaling: { min: number; max: number; target?: number };
      if (onDemand) {
        // On demand is min 0; keep a max of more than one so that busy times still scale out.
        const current = await client.call<{ scaling: { max: number } }>("GET", path(name));
        scaling = { min: 0, max: max ?? Math.max(current.scaling.max, 1) };
      } else {
        const count = parsePositiveInt(replicas!, "replicas", { allowZero: true });
        scaling = { min: count, max: max ?? count };
      }
      if (target !== undefined) scaling.target = target;
      const updated = await client.call<ModelView>("PATCH", path(name), { scaling });
      const autoscaled = scaling.max > Math.max(scaling.min, 1) ? ` and scales up to ${countOf(scaling.max, "replica")} while requests queue` : "";
      print(command, updated, () =>
        onDemand
          ? `'${updated.name}' runs on demand: a replica starts at the first request${autoscaled || ` (up to ${countOf(scaling.max, "replica")})`}, and stops when idle.`
          : `'${updated.name}' keeps ${countOf(scaling.min, "replica")} running${autoscaled}.`,
      );
    });

  withExamples(model.command("remove <name>").alias("rm"), "llmgw ctl model remove tiny-llama")
    .description("Remove a model; its replicas stop")
    .option("--json", "print JSON")
    .action(async (name: string, _options: Options, command: Command) => {
      const removed = await connect(command).call<{ deleted: string }>("DELETE", path(name));
      print(command, removed, () => `Removed model '${name}'.`);
    });

  withExamples(model.command("unpark <name>"), "llmgw ctl model unpark tiny-llama")
    .description("Start a parked model again after fixing what made it fail")
    .option("--json", "print JSON")
    .action(async (name: string, _options: Options, command: Command) => {
      const result = await connect(command).call<{ model: string; unparked: number }>("POST", path(name, "/unpark"));
      print(command, result, () => `Unparked ${countOf(result.unparked, "replica")} of '${name}'.`);
    });

  withExamples(model.command("plan <repo>"), "llmgw ctl model plan bartowski/Qwen2.5-7B-Instruct-GGUF --context 8192")
    .description("Which artifact of a repository (owner/name, or a local file or folder) runs where, and what it needs")
    .option("--context <n>", "context to plan for (tokens)", String(DEFAULT_CONTEXT_POOL))
    .option("--format <format>", "only gguf or only safetensors")
    .option("--revision <rev>", "branch, tag or commit (default main)")
    .option("--json", "print JSON")
    .action(async (repo: string, options: Options, command: Command) => {
      // A relative path means this shell's folder, so it travels to the server as an absolute one.
      const query = new URLSearchParams({ repo: absoluteRepoArgument(repo), context: String(options.context) });
      if (typeof options.format === "string") query.set("format", options.format);
      if (typeof options.revision === "string") query.set("revision", options.revision);
      const result = await connect(command).call<RepositoryPlan>("GET", `/api/v1/plan?${query}`);
      print(command, result, () => renderRepositoryPlan(result));
    });
}

interface ShownAdapter {
  name: string;
  served_name?: string;
  scale: number;
  source: unknown;
}

/** The adapters: the name clients ask for, the scale and the file. */
function renderAdapters(name: string, adapters: ShownAdapter[]): string {
  return `adapters (served on ${name}'s replicas):\n${renderTable(
    ["SERVED AS", "ADAPTER", "SCALE", "SOURCE"],
    adapters.map((a) => [a.served_name ?? `${name}:${a.name}`, a.name, String(a.scale), describeSource(a.source)]),
  )}`;
}

/** `origin: REPO @ REVISION`, its files with their full sha256, and the revision a rollback goes back to. */
function renderOrigin(name: string, origin: ModelOrigin): string {
  const lines = [
    `origin: ${origin.repo} @ ${origin.revision}`,
    renderTable(
      ["FILE", "SHA256", "SIZE"],
      origin.files.map((f) => [f.path, f.sha256, formatBytes(f.bytes)]),
    ),
  ];
  if (origin.previous !== undefined) {
    const source = describeSource(origin.previous.source);
    lines.push(
      `previous: ${origin.previous.revision}${source === null ? "" : ` (${source})`}, ${countOf(origin.previous.files.length, "file")}; 'llmgw ctl model rollback ${name}' goes back to it`,
    );
  }
  return lines.join("\n");
}

/** A model source for people: the mirror's model/version/file, a local path, or the value as given. */
function describeSource(source: unknown): string | null {
  if (source === null || source === undefined) return null;
  if (typeof source === "string") return source;
  const { kind, model, version, file, path } = source as Record<string, unknown>;
  if (kind === "mirror") return `mirror ${String(model)}/${String(version)}/${String(file)}`;
  if (kind === "file") return String(path);
  return JSON.stringify(source);
}

function renderUpdateChecks(checks: UpdateCheck[]): string {
  if (checks.length === 0) return "No model to check: only models served with 'llmgw ctl model serve' know their repository.";
  const short = (revision: string | null) => (revision === null ? null : revision.slice(0, SHORT_REVISION));
  const table = renderTable(
    ["MODEL", "REPO", "REVISION", "LATEST", "UPDATE", "CHECKED", "ERROR"],
    checks.map((c) => [c.model, c.repo, short(c.revision), short(c.latest_revision), c.update_available ? "yes" : "no", c.checked_at, c.error]),
  );
  return checks.some((c) => c.update_available) ? `${table}\n\nUpdate with 'llmgw ctl model update NAME'.` : table;
}

function renderRepositoryPlan(result: RepositoryPlan): string {
  const lines = [`${result.repo} @ ${result.revision} (${result.sha.slice(0, 12)}), context ${result.plan.contextSize} tokens`, ""];
  const skipped = result.artifacts.filter((a) => !a.planned);
  lines.push(renderPlanTable(result.plan));
  if (skipped.length > 0) lines.push("", "Not planned:", ...skipped.map((a) => `  ${a.description}: ${a.note ?? "not planned"}`));
  return lines.join("\n");
}
