// `llmgw ctl cluster status`: the servers sharing this server's database, where each is
// reached, its version, when it was last seen, and which one leads (GET /api/v1/cluster).
import type { Command } from "commander";
import type { ClusterView } from "../cluster/cluster-routes.ts";
import { type CtlHelpers, type CtlOptions as Options, withExamples } from "./ctl-common.ts";
import { ago } from "./ctl-node.ts";
import { renderTable } from "./output.ts";

export function registerClusterCommands(ctl: Command, { connect, print }: CtlHelpers): void {
  const cluster = ctl.command("cluster").description("The llmgw servers sharing one PostgreSQL");
  withExamples(cluster.command("status"), "llmgw ctl cluster status")
    .description("Servers with their addresses, versions and last seen, and which one leads")
    .option("--json", "print JSON")
    .action(async (_options: Options, command: Command) => {
      const view = await connect(command).call<ClusterView>("GET", "/api/v1/cluster");
      print(command, view, () =>
        [
          view.leader === null
            ? "leader: none at the moment (a server takes the lead within seconds)"
            : `leader: ${view.leader.name} (term ${view.leader.term}, since ${view.leader.since ?? "?"})`,
          "",
          renderTable(
            ["NAME", "URL", "VERSION", "STATE", "LAST SEEN", "ROLE"],
            view.servers.map((server) => [
              server.name + (server.name === view.self ? " *" : ""),
              server.url,
              server.version,
              server.live ? "running" : server.stopped_at !== null ? "stopped" : "not seen",
              ago(server.last_seen),
              server.leader ? "leader" : server.live ? "standby" : "-",
            ]),
          ),
          "",
          "* the server that answered",
        ].join("\n"),
      );
    });
}
