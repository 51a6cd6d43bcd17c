// `llmgw ctl node ...`: the fleet's nodes over the admin API: list (state, last
// heartbeat, cores, memory and GPUs used/total, replicas), show, update (its address: the
// only way it changes after the join), drain, undrain, remove,
// and the join token with the command that joins a new node. `ctl model show` prints a
// model's health from the fleet (replicas by state and node, parking, placement explanation).
import type { Command } from "commander";
import { countOf, formatBytes } from "../core/format.ts";
import { checkAddress } from "../fleet/node-address.ts";
import type { AutoscalingView } from "../fleet/autoscaling.ts";
import { type CtlHelpers, type CtlOptions as Options, withExamples } from "./ctl-common.ts";
import { renderTable } from "./output.ts";

export interface NodeView {
  name: string;
  state: string;
  address: string;
  last_heartbeat: string;
  cores: { used: number; total: number };
  memory_bytes: { used: number; total: number };
  gpus: Array<{ index: number; class: string; memory_bytes: number; replica: string | null }>;
  engines: Array<{ engine: string; version: string }>;
  labels: Record<string, string>;
  replicas: Array<{ id: string; model: string; state: string; profile: string }>;
}

/** What ctl reads of a model's health (GET /api/v1/models/:name/health, fleet-views.ts). */
export interface ModelHealthView {
  model: string;
  state: string;
  reason: string | null;
  summary: string;
  parked: { at: string; reason: string } | null;
  placement: string[] | null;
  /** When replicas share a node: how many where, and why (or "moving one to n2"). */
  spread?: string | null;
  /** Models that scale between min and max: the leader's target, load now and last decision. */
  autoscaling?: AutoscalingView | null;
  weights_problem: string | null;
  replicas: Array<{
    id: string;
    state: string;
    nodes: string[];
    profile: string;
    attempt: number;
    failures: number;
    weights_verified: boolean;
    last_error: string | null;
  }>;
}

export function registerNodeCommands(ctl: Command, { connect, print }: CtlHelpers): void {
  const node = ctl.command("node").description("Nodes of the fleet: the machines agents run on");
  withExamples(node.command("list"), "llmgw ctl node list")
    .description("Nodes with their state, last heartbeat, cores, memory and GPUs used/total, and replicas")
    .option("--json", "print JSON")
    .action(async (_options: Options, command: Command) => {
      const { data } = await connect(command).call<{ data: NodeView[] }>("GET", "/api/v1/nodes");
      print(command, data, () =>
        data.length === 0
          ? "No nodes have joined. Start one with the command 'llmgw ctl node join-token' prints."
          : renderTable(
              ["NAME", "STATE", "LAST HEARTBEAT", "CORES", "MEMORY", "GPUS", "REPLICAS"],
              data.map((n) => [
                n.name,
                n.state,
                ago(n.last_heartbeat),
                `${n.cores.used}/${n.cores.total}`,
                `${formatBytes(n.memory_bytes.used)} / ${formatBytes(n.memory_bytes.total)}`,
                gpuSummary(n),
                String(n.replicas.length),
              ]),
            ),
      );
    });
  withExamples(node.command("show <name>"), "llmgw ctl node show gpu-01")
    .description("One node: its hardware, engines, labels, GPUs and replicas")
    .option("--json", "print JSON")
    .action(async (name: string, _options: Options, command: Command) => {
      const n = await connect(command).call<NodeView>("GET", `/api/v1/nodes/${encodeURIComponent(name)}`);
      print(command, n, () =>
        [
          `node ${n.name}: ${n.state}, last heartbeat ${ago(n.last_heartbeat)}, address ${n.address}`,
          `cores ${n.cores.used}/${n.cores.total} used, memory ${formatBytes(n.memory_bytes.used)} / ${formatBytes(n.memory_bytes.total)} used`,
          `engines: ${n.engines.map((e) => `${e.engine} ${e.version}`).join(", ") || "none"}`,
          ...(Object.keys(n.labels).length > 0
            ? [
                `labels: ${Object.entries(n.labels)
                  .map(([k, v]) => `${k}=${v}`)
                  .join(",")}`,
              ]
            : []),
          ...(n.gpus.length > 0
            ? [
                "",
                renderTable(
                  ["GPU", "CLASS", "MEMORY", "REPLICA"],
                  n.gpus.map((g) => [String(g.index), g.class, formatBytes(g.memory_bytes), g.replica]),
                ),
              ]
            : []),
          "",
          n.replicas.length === 0
            ? "no replicas"
            : renderTable(
                ["REPLICA", "MODEL", "PROFILE", "STATE"],
                n.replicas.map((r) => [r.id, r.model, r.profile, r.state]),
              ),
        ].join("\n"),
      );
    });
  withExamples(node.command("update <name>"), "llmgw ctl node update gpu-01 --address 10.0.0.8")
    .description(
      "Change the node's address (where the gateway reaches its engines). It is fixed at join: an agent that reports another one is refused until this is run",
    )
    .requiredOption("--address <host>", "the node's new host name or IP address (no scheme, no port, no IPv6 zone id; IPv4 in dotted decimal)")
    .option("--json", "print JSON")
    .action(async (name: string, options: Options & { address: string }, command: Command) => {
      const address = checkAddress(options.address, "--address");
      const n = await connect(command).call<NodeView & { previous_address: string }>("PATCH", `/api/v1/nodes/${encodeURIComponent(name)}`, { address });
      print(command, n, () => describeAddressUpdate(n));
    });
  withExamples(node.command("drain <name>"), "llmgw ctl node drain gpu-01")
    .description("Place nothing new on the node and move its replicas elsewhere where there is room (each stops once its replacement is ready)")
    .option("--json", "print JSON")
    .action(async (name: string, _options: Options, command: Command) => {
      const n = await connect(command).call<NodeView>("POST", `/api/v1/nodes/${encodeURIComponent(name)}/drain`);
      print(command, n, () => describeDrain(n));
    });
  withExamples(node.command("undrain <name>"), "llmgw ctl node undrain gpu-01")
    .description("End a drain: the node takes new replicas again (a lost node once its agent is back)")
    .option("--json", "print JSON")
    .action(async (name: string, _options: Options, command: Command) => {
      const n = await connect(command).call<NodeView>("POST", `/api/v1/nodes/${encodeURIComponent(name)}/undrain`);
      print(command, n, () => describeUndrain(n));
    });
  withExamples(node.command("remove <name>"), "llmgw ctl node remove gpu-01")
    .description("Remove the node: its replicas are placed elsewhere and its credential stops working")
    .option("--json", "print JSON")
    .action(async (name: string, _options: Options, command: Command) => {
      const removed = await connect(command).call<{ removed: string }>("DELETE", `/api/v1/nodes/${encodeURIComponent(name)}`);
      print(command, removed, () => `Removed node '${removed.removed}'. To bring the machine back, delete node.json in its agent's data dir and join again.`);
    });
  withExamples(node.command("join-token"), "llmgw ctl node join-token")
    .description("Print the join token and the command that joins a node")
    .option("--json", "print JSON")
    .action(async (_options: Options, command: Command) => {
      const client = connect(command);
      const { token } = await client.call<{ token: string }>("GET", "/api/v1/nodes/join-token");
      print(
        command,
        { token, server: client.baseUrl },
        () => `${token}\n\nOn the new node:\n  llmgw agent --server ${client.baseUrl} --join-token ${token} --advertise <this node's address>`,
      );
    });
}

/** What `node update --address` did: the new address, the old one, and what happens to the node's replicas. */
export function describeAddressUpdate(n: Pick<NodeView, "name" | "address"> & { previous_address: string }): string {
  if (n.previous_address === n.address) return `Node '${n.name}' already has address ${n.address}; nothing changed.`;
  return (
    `Node '${n.name}' now has address ${n.address} (was ${n.previous_address}). Its agent must report that address (--advertise ${n.address}); ` +
    "its replicas are routed to again once it reports them running there."
  );
}

/** What `node drain` did, with the node's replicas counted in words that agree with the count. */
export function describeDrain(n: Pick<NodeView, "name" | "replicas">): string {
  const count = n.replicas.length;
  const start = `Node '${n.name}' is draining: nothing new is placed there`;
  if (count === 0) return `${start}, and it runs no replicas. 'llmgw ctl node undrain ${n.name}' ends the drain.`;
  const moves =
    count === 1
      ? "its 1 replica stops once replaced elsewhere (it keeps running if there is no room elsewhere)"
      : `its ${countOf(count, "replica")} stop once replaced elsewhere (those without room elsewhere keep running)`;
  return `${start}, and ${moves}. 'llmgw ctl node undrain ${n.name}' ends the drain.`;
}

/** What `node undrain` left: a node that takes replicas now, or a lost one that will once it is back. */
export function describeUndrain(n: Pick<NodeView, "name" | "state">): string {
  if (n.state === "lost") return `Node '${n.name}' is no longer draining; it is lost now and takes new replicas once its agent is back.`;
  return `Node '${n.name}' is ${n.state}: new replicas may be placed there again.`;
}

/** `ctl model show NAME`: the model's health as the fleet sees it. */
export function renderModelHealth(health: ModelHealthView): string {
  const lines = [`model ${health.model}: ${health.state}${health.reason ? ` (${health.reason})` : ""}`, `replicas: ${health.summary}`];
  if (health.parked)
    lines.push(`parked since ${health.parked.at}: ${health.parked.reason}`, `  unpark with 'llmgw ctl model unpark ${health.model}' once the cause is fixed`);
  if (health.placement) lines.push("placement: no node can take a replica:", ...health.placement.map((line) => `  ${line}`));
  if (health.spread) lines.push(`spread: ${health.spread}`);
  if (health.autoscaling) lines.push(...renderAutoscaling(health.autoscaling));
  if (health.weights_problem) lines.push(`weights: ${health.weights_problem}`);
  if (health.replicas.length > 0) {
    lines.push(
      "",
      renderTable(
        ["REPLICA", "STATE", "NODES", "PROFILE", "ATTEMPT", "FAILURES", "WEIGHTS", "LAST ERROR"],
        health.replicas.map((r) => [
          r.id,
          r.state,
          r.nodes.join(","),
          r.profile,
          String(r.attempt),
          String(r.failures),
          r.weights_verified ? "verified" : "-",
          r.last_error,
        ]),
      ),
    );
  }
  return lines.join("\n");
}

function gpuSummary(node: NodeView): string {
  if (node.gpus.length === 0) return "-";
  const used = node.gpus.filter((g) => g.replica !== null).length;
  const classes = [...new Set(node.gpus.map((g) => g.class))].join(",");
  return `${used}/${node.gpus.length} ${classes}`;
}

/** A model's autoscaling in two lines: where it stands now, and its last decision with why. */
export function renderAutoscaling(scaling: AutoscalingView): string[] {
  const load = scaling.load === null ? "load not read yet" : `load now ${scaling.load}`;
  return [
    `autoscaling: ${countOf(scaling.desired, "replica")} wanted (${scaling.min} to ${scaling.max}); target ${scaling.target} in flight and queued per replica, ${load}; up after ${scaling.up_after} s above target, down after ${scaling.down_after} s below half`,
    scaling.last === null
      ? "  last decision: none yet"
      : `  last decision: ${scaling.last.direction} from ${scaling.last.from} to ${scaling.last.to}, ${ago(scaling.last.at)}: ${scaling.last.why}`,
  ];
}

export function ago(iso: string): string {
  const seconds = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  return seconds < 120 ? `${seconds}s ago` : seconds < 7200 ? `${Math.round(seconds / 60)}m ago` : iso;
}
