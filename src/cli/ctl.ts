// `llmgw ctl`: the admin CLI over the admin API. Each subcommand is one API call (or a
// few) and prints a table for people or, with --json, the API's JSON for scripts.
import { readFileSync } from "node:fs";
import path from "node:path";
import type { Command } from "commander";
import { BadRequestError, describeError } from "../core/errors.ts";
import { AdminClient, type AdminConnectionFlags } from "./admin-client.ts";
import { parsePositiveInt } from "./config.ts";
import { DEFAULT_CONTEXT_POOL } from "../catalog/model-schema.ts";
import { renderTable } from "./output.ts";
import { countOf } from "../core/format.ts";
import { renderPlanTable } from "../plan/render.ts";
import { registerMirrorCommands } from "./ctl-mirror.ts";
import { registerNodeCommands, renderModelHealth } from "./ctl-node.ts";
import { absoluteFilePath, absoluteRepoArgument } from "./local-paths.ts";
import type { ModelPlan } from "../plan/plan.ts";

type Options = Record<string, unknown>;

export function registerCtl(program: Command): void {
  const ctl = program
    .command("ctl")
    .description("Administer a running llmgw (models, keys, replicas) over its admin API")
    .option("--server <url>", "server URL (or LLMGW_SERVER; default: the local `llmgw up`)")
    .option("--key <key>", "admin key (or LLMGW_KEY; default: DATA_DIR/admin.key)")
    .option("--data-dir <dir>", "data dir of the local server (or LLMGW_DATA_DIR)");

  const connect = (command: Command) => AdminClient.fromFlags(command.optsWithGlobals() as AdminConnectionFlags);
  const print = (command: Command, json: unknown, human: () => string) => {
    process.stdout.write((command.optsWithGlobals().json === true ? JSON.stringify(json, null, 2) : human()) + "\n");
  };

  const model = ctl.command("model").description("Models in the catalog");
  model
    .command("list")
    .option("--json", "print JSON")
    .action(async (_options: Options, command: Command) => {
      const { data } = await connect(command).call<{ data: any[] }>("GET", "/api/v1/models");
      print(command, data, () =>
        data.length === 0
          ? "No models yet. Add one with 'llmgw ctl model add NAME --gguf FILE' or '--external URL'."
          : renderTable(
              ["NAME", "ALIASES", "ENGINES", "STATE", "READY", "REASON"],
              data.map((m) => [m.name, m.aliases.join(",") || null, m.profiles.map((p: any) => p.engine).join(","), m.health.state, `${m.health.ready}/${m.health.replicas}`, m.health.reason]),
            ),
      );
    });
  model
    .command("show <name>")
    .description("Show a model's health: replicas by state and node, parking, failures, last error, placement explanation (--json: the whole model)")
    .option("--json", "print the model with its profiles, health and replicas as JSON")
    .action(async (name: string, options: Options, command: Command) => {
      const client = connect(command);
      if (options.json === true) {
        process.stdout.write(JSON.stringify(await client.call("GET", `/api/v1/models/${encodeURIComponent(name)}`), null, 2) + "\n");
        return;
      }
      process.stdout.write(renderModelHealth(await client.call("GET", `/api/v1/models/${encodeURIComponent(name)}/health`)) + "\n");
    });
  model
    .command("add [name]")
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
    .option("--json", "print JSON")
    .action(async (name: string | undefined, options: Options, command: Command) => {
      const body = modelFromFlags(name, options);
      const created = await connect(command).call("POST", "/api/v1/models", body);
      print(command, created, () => `Added model '${created.name}' (${created.health.state}${created.health.reason ? `: ${created.health.reason}` : ""}).`);
    });
  model
    .command("update <name>")
    .description("Change a model with a JSON patch (fields to change; profiles are replaced as a list)")
    .requiredOption("--patch <json>", "JSON object, or @file to read one")
    .option("--json", "print JSON")
    .action(async (name: string, options: Options, command: Command) => {
      const argument = String(options.patch);
      // A relative weights path means: from here (inline JSON), or next to the @file.
      const base = argument.startsWith("@") ? path.dirname(path.resolve(argument.slice(1))) : process.cwd();
      const patch = withAbsoluteFileSource(readJsonArgument(argument, "--patch"), base);
      const updated = await connect(command).call("PATCH", `/api/v1/models/${encodeURIComponent(name)}`, patch);
      print(command, updated, () => `Updated model '${updated.name}'.`);
    });
  model
    .command("rm <name>")
    .description("Remove a model; its replicas stop")
    .action(async (name: string, _options: Options, command: Command) => {
      await connect(command).call("DELETE", `/api/v1/models/${encodeURIComponent(name)}`);
      process.stdout.write(`Removed model '${name}'.\n`);
    });
  model
    .command("unpark <name>")
    .description("Start a parked model again after fixing what made it fail")
    .action(async (name: string, _options: Options, command: Command) => {
      const result = await connect(command).call("POST", `/api/v1/models/${encodeURIComponent(name)}/unpark`);
      process.stdout.write(`Unparked ${countOf(result.unparked, "replica")} of '${name}'.\n`);
    });

  model
    .command("plan <repo>")
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
      const result = await connect(command).call("GET", `/api/v1/plan?${query}`);
      print(command, result, () => renderRepositoryPlan(result));
    });

  registerMirrorCommands(ctl, { connect, print });
  registerNodeCommands(ctl, { connect, print });

  const key = ctl.command("key").description("API keys");
  key
    .command("create")
    .requiredOption("--name <name>", "who or what the key is for")
    .option("--admin", "an admin key (admin API and every model)")
    .option("--models <names>", "comma-separated models the key may use (default: all)")
    .option("--expires <when>", "expiry: an ISO date-time or a duration like 30d, 12h")
    .option("--json", "print JSON")
    .action(async (options: Options, command: Command) => {
      const created = await connect(command).call("POST", "/api/v1/keys", {
        name: options.name,
        role: options.admin === true ? "admin" : "client",
        ...(typeof options.models === "string" ? { allowed_models: options.models.split(",").map((m) => m.trim()).filter(Boolean) } : {}),
        ...(typeof options.expires === "string" ? { expires_at: parseExpiry(options.expires) } : {}),
      });
      print(command, created, () => `${created.key}\n\nThis is the only time the key is shown; store it now. (id ${created.id}, prefix ${created.prefix})`);
    });
  key
    .command("list")
    .option("--json", "print JSON")
    .action(async (_options: Options, command: Command) => {
      const { data } = await connect(command).call<{ data: any[] }>("GET", "/api/v1/keys");
      print(command, data, () =>
        renderTable(
          ["ID", "NAME", "PREFIX", "ROLE", "MODELS", "EXPIRES", "STATE", "LAST USED"],
          data.map((k) => [k.id, k.name, `${k.prefix}…`, k.role, k.allowed_models?.join(",") ?? "all", k.expires_at, k.revoked_at === null ? "active" : "revoked", k.last_used_at]),
        ),
      );
    });
  key
    .command("revoke <ref>")
    .description("Revoke a key by id, prefix or name; applies to its next request")
    .action(async (ref: string, _options: Options, command: Command) => {
      const revoked = await connect(command).call("DELETE", `/api/v1/keys/${encodeURIComponent(ref)}`);
      process.stdout.write(`Revoked key '${revoked.name}' (${revoked.prefix}…).\n`);
    });

  ctl
    .command("replicas")
    .description("Replicas and their states")
    .option("--json", "print JSON")
    .action(async (_options: Options, command: Command) => {
      const { data } = await connect(command).call<{ data: any[] }>("GET", "/api/v1/replicas");
      print(command, data, () =>
        renderTable(
          ["MODEL", "PROFILE", "ENGINE", "STATE", "ATTEMPT", "FAILURES", "ENDPOINT", "LAST ERROR"],
          data.map((r) => [r.modelName, r.profile, r.engine, r.state, r.attempt, r.failures, r.endpoint ? r.endpoint.origin + r.endpoint.basePath : null, r.lastError]),
        ),
      );
    });
}

function renderRepositoryPlan(result: { repo: string; revision: string; sha: string; artifacts: Array<{ description: string; planned: boolean; note?: string }>; plan: ModelPlan }): string {
  const lines = [`${result.repo} @ ${result.revision} (${result.sha.slice(0, 12)}), context ${result.plan.contextSize} tokens`, ""];
  const skipped = result.artifacts.filter((a) => !a.planned);
  lines.push(renderPlanTable(result.plan));
  if (skipped.length > 0) lines.push("", "Not planned:", ...skipped.map((a) => `  ${a.description}: ${a.note ?? "not planned"}`));
  return lines.join("\n");
}

function modelFromFlags(name: string | undefined, options: Options): unknown {
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

function readJsonArgument(value: string, flag: string): unknown {
  return parseJsonText(value.startsWith("@") ? readFileSync(value.slice(1), "utf8") : value, flag);
}

function parseJsonText(text: string, what: string): unknown {
  try {
    return JSON.parse(text);
  } catch (error) {
    throw new BadRequestError(`${what} is not valid JSON: ${describeError(error)}.`);
  }
}

/** "30d", "12h", "45m" from now, or an ISO date-time as given. */
export function parseExpiry(value: string, now: number = Date.now()): string {
  const match = /^(\d+)\s*([dhm])$/.exec(value.trim());
  if (match !== null) {
    const unit = { d: 86_400_000, h: 3_600_000, m: 60_000 }[match[2] as "d" | "h" | "m"];
    return new Date(now + Number(match[1]) * unit).toISOString();
  }
  if (Number.isNaN(Date.parse(value))) throw new BadRequestError(`Invalid --expires '${value}': use a duration like 30d or 12h, or an ISO date-time.`);
  return value;
}
