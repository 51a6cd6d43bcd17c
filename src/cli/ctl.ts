// `llmgw ctl`: the admin CLI over the admin API. Each subcommand is one API call (or a
// few, or a job it follows) and prints a table for people or, with --json, the API's JSON
// for scripts; every leaf command shows an example under --help. This module holds the
// connection flags, the keys and replicas commands, and hands the rest to ctl-model.ts,
// ctl-job.ts, ctl-mirror.ts and ctl-node.ts.
import type { Command } from "commander";
import { BadRequestError } from "../core/errors.ts";
import { AdminClient, type AdminConnectionFlags } from "./admin-client.ts";
import { type CtlHelpers, type CtlOptions as Options, wantsJson, withExamples } from "./ctl-common.ts";
import { registerJobCommands } from "./ctl-job.ts";
import { registerMirrorCommands } from "./ctl-mirror.ts";
import { registerModelCommands } from "./ctl-model.ts";
import { registerNodeCommands } from "./ctl-node.ts";
import { registerUsageCommand } from "./ctl-usage.ts";
import { renderTable } from "./output.ts";

export function registerCtl(program: Command): void {
  const ctl = program
    .command("ctl")
    .description("Administer a running llmgw (models, jobs, keys, replicas, mirror, nodes) over its admin API")
    .option("--server <url>", "server URL (or LLMGW_SERVER; default: the local `llmgw up`)")
    .option("--key <key>", "admin key (or LLMGW_KEY; default: DATA_DIR/admin.key)")
    .option("--data-dir <dir>", "data dir of the local server (or LLMGW_DATA_DIR)");

  const helpers: CtlHelpers = {
    connect: (command) => AdminClient.fromFlags(command.optsWithGlobals() as AdminConnectionFlags),
    print: (command, json, human) => {
      process.stdout.write((wantsJson(command) ? JSON.stringify(json, null, 2) : human()) + "\n");
    },
  };
  const { connect, print } = helpers;

  registerModelCommands(ctl, helpers);
  registerJobCommands(ctl, helpers);
  registerMirrorCommands(ctl, helpers);
  registerNodeCommands(ctl, helpers);
  registerUsageCommand(ctl, helpers);

  const key = ctl.command("key").description("API keys");
  withExamples(key.command("create"), "llmgw ctl key create --name ci --models tiny-llama --expires 30d", "llmgw ctl key create --name ops --admin")
    .description("Create an API key; it is shown once")
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
  withExamples(key.command("list"), "llmgw ctl key list")
    .description("API keys: name, prefix, role, models, expiry, state and last use (never the key)")
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
  withExamples(key.command("revoke <ref>"), "llmgw ctl key revoke ci")
    .description("Revoke a key by id, prefix or name; applies to its next request")
    .option("--json", "print JSON")
    .action(async (ref: string, _options: Options, command: Command) => {
      const revoked = await connect(command).call("DELETE", `/api/v1/keys/${encodeURIComponent(ref)}`);
      print(command, revoked, () => `Revoked key '${revoked.name}' (${revoked.prefix}…).`);
    });

  withExamples(ctl.command("replicas"), "llmgw ctl replicas --json")
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
