// `llmgw ctl`: the admin CLI over the admin API. Each subcommand is one API call (or a
// few, or a job it follows) and prints a table for people or, with --json, the API's JSON
// for scripts; every leaf command shows an example under --help. This module holds the
// connection flags and the replicas command, and hands the rest to ctl-model.ts,
// ctl-key.ts, ctl-job.ts, ctl-mirror.ts and ctl-node.ts.
import type { Command } from "commander";
import type { ReplicaView } from "../fleet/replica-table.ts";
import { AdminClient, type AdminConnectionFlags } from "./admin-client.ts";
import { type CtlHelpers, type CtlOptions as Options, wantsJson, withExamples } from "./ctl-common.ts";
import { registerJobCommands } from "./ctl-job.ts";
import { registerKeyCommands } from "./ctl-key.ts";
import { registerMirrorCommands } from "./ctl-mirror.ts";
import { registerModelCommands } from "./ctl-model.ts";
import { registerNodeCommands } from "./ctl-node.ts";
import { registerNotifyCommands } from "./ctl-notify.ts";
import { registerUsageCommand } from "./ctl-usage.ts";
import { registerClusterCommands } from "./ctl-cluster.ts";
import { renderTable } from "./output.ts";

export function registerCtl(program: Command): void {
  const ctl = program
    .command("ctl")
    .description("Administer a running llmgw (models, jobs, keys, replicas, mirror, nodes, notifications) over its admin API")
    .option("--server <url>", "server URL (or LLMGW_SERVER; default: the local `llmgw up`)")
    .option("--key <key>", "admin key (or LLMGW_KEY; default: DATA_DIR/admin.key)")
    .option("--data-dir <dir>", "data dir of the local server (or LLMGW_DATA_DIR)");

  const helpers: CtlHelpers = {
    connect: (command) => AdminClient.fromFlags(command.optsWithGlobals() as AdminConnectionFlags),
    print: (command, json, human) => {
      process.stdout.write(`${wantsJson(command) ? JSON.stringify(json, null, 2) : human()}\n`);
    },
  };
  const { connect, print } = helpers;

  registerModelCommands(ctl, helpers);
  registerJobCommands(ctl, helpers);
  registerMirrorCommands(ctl, helpers);
  registerNodeCommands(ctl, helpers);
  registerUsageCommand(ctl, helpers);
  registerKeyCommands(ctl, helpers);
  registerNotifyCommands(ctl, helpers);
  registerClusterCommands(ctl, helpers);

  withExamples(ctl.command("replicas"), "llmgw ctl replicas --json")
    .description("Replicas and their states")
    .option("--json", "print JSON")
    .action(async (_options: Options, command: Command) => {
      const { data } = await connect(command).call<{ data: ReplicaView[] }>("GET", "/api/v1/replicas");
      print(command, data, () =>
        renderTable(
          ["MODEL", "PROFILE", "ENGINE", "STATE", "ATTEMPT", "FAILURES", "ENDPOINT", "LAST ERROR"],
          data.map((r) => [
            r.modelName,
            r.profile,
            r.engine,
            r.state,
            r.attempt,
            r.failures,
            r.endpoint ? r.endpoint.origin + r.endpoint.basePath : null,
            r.lastError,
          ]),
        ),
      );
    });
}
