// The node of `llmgw up`: the server's own machine, joined to its own fleet and run by a
// NodeAgent that calls the fleet in-process, through the same Assignments interface
// `llmgw agent` uses over HTTP. The node keeps its identity in DATA_DIR/agent/node.json
// like any agent; a credential the store no longer knows (a new database) joins again.
import os from "node:os";
import path from "node:path";
import { describeError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import { llamaCppLaunch } from "../engines/llamacpp/engine-launch.ts";
import type { NodeInventory } from "../fleet/fleet-types.ts";
import type { ServerParts } from "../server/server.ts";
import { LocalWeights } from "./local-weights.ts";
import { WeightsIdentity } from "./weights-identity.ts";
import { AGENT_FEATURES } from "../fleet/fleet-types.ts";
import { BUNDLED_ENGINE } from "./inventory.ts";
import { NodeAgent, type LaunchBuilder, type SupervisorTimings } from "./node-agent.ts";
import { readNodeIdentity, writeNodeIdentity } from "./node-identity.ts";

export interface LocalNodeOptions {
  logger: Logger;
  /** Default: this machine's host name. */
  name?: string;
  supervisor?: SupervisorTimings;
  inventory?: NodeInventory;
  launch?: LaunchBuilder;
}

/** The bundled llama.cpp engine for every replica (what `up` runs). */
export const bundledLaunch: LaunchBuilder = ({ assignment, weightsPath, adapterPaths, host, port }) =>
  llamaCppLaunch({
    weightsPath,
    modelName: assignment.modelName,
    profile: assignment.profile,
    engineKey: assignment.engineKey,
    host,
    port,
    ...(adapterPaths === undefined ? {} : { adapters: adapterPaths }),
  });

export function thisMachineInventory(): NodeInventory {
  return {
    cores: os.availableParallelism(),
    memoryBytes: os.totalmem(),
    gpus: [],
    // `up` runs the bundled llama.cpp only (its CPU build), so GPUs are not looked for.
    engines: [BUNDLED_ENGINE],
  };
}

export async function startLocalNode(parts: ServerParts, options: LocalNodeOptions): Promise<NodeAgent> {
  const { fleet } = parts;
  const agentDir = path.join(parts.config.dataDir, "agent");
  const address = "127.0.0.1";
  const inventory = { ...(options.inventory ?? thisMachineInventory()), features: AGENT_FEATURES };
  const name = options.name ?? localNodeName();
  let identity = readNodeIdentity(agentDir);
  if (identity !== null) {
    try {
      fleet.nodes.authenticate(identity.credential, identity.name);
    } catch (error) {
      options.logger.warn({ err: describeError(error) }, "the local node's credential is not known to this store; joining again");
      identity = null;
    }
  }
  if (identity === null) {
    // This machine's own node: an older one under the same name (its node.json lost) is replaced.
    const stale = fleet.nodes.list().find((node) => node.name === name);
    if (stale !== undefined) await fleet.remove(stale.name);
    const joined = await fleet.join({ joinToken: parts.joinToken(), name, address, inventory, labels: {} });
    identity = { server: "in-process", nodeId: joined.nodeId, name: joined.name, credential: joined.credential };
    writeNodeIdentity(agentDir, identity);
  }
  const agent = new NodeAgent({
    assignments: fleet,
    credential: identity.credential,
    name: identity.name,
    address,
    inventory,
    labels: {},
    stateRoot: path.join(parts.config.dataDir, "runs"),
    weights: new LocalWeights({
      mirror: parts.mirror,
      identity: new WeightsIdentity({ memoFile: path.join(agentDir, "weights-verified.json"), logger: options.logger }),
    }),
    launch: options.launch ?? bundledLaunch,
    logger: options.logger,
    onDismissed: (error) =>
      options.logger.error(
        { err: error.message },
        "this server's own node was removed from its fleet, so `up` runs no engines now; restart `llmgw up` to join again",
      ),
    ...(options.supervisor ? { supervisor: options.supervisor } : {}),
  });
  agent.start();
  return agent;
}

/** A node name from the host name, within the node name rules. */
function localNodeName(): string {
  const cleaned = os
    .hostname()
    .replace(/[^A-Za-z0-9._-]/g, "-")
    .replace(/^[^A-Za-z0-9]+/, "")
    .slice(0, 63);
  return cleaned === "" ? "local" : cleaned;
}
