// `llmgw agent`: a node of the fleet. On its first start it joins the server with the
// join token and keeps the node credential it gets in its data dir (node.json); later
// starts use that. It reports what the machine has (detected, or `--inventory FILE`), runs
// the engines the server assigns it (bundled llama.cpp, the node's llama-server, vLLM),
// fetches their weights from the server's mirror into its cache, and stops every engine
// on SIGINT, SIGTERM or SIGHUP. `--server` may list the servers of one cluster: the agent
// talks to one of them and fails over to the next when it cannot (http-assignments.ts).
import { builtLlamaServer } from "../engines/llama-server/llama-cpp-source.ts";
import os from "node:os";
import path from "node:path";
import { BadRequestError, describeError, LlmgwError } from "../core/errors.ts";
import { createLogger, parseLogFormat, type Logger } from "../core/log.ts";
import { engineFor, engineLaunch, type NodeEngines } from "../engines/engine-launch.ts";
import { modelDeclaresPooling } from "../engines/llama-server/llama-server-launch.ts";
import { rayHeadLaunch, rayWorkerLaunch } from "../engines/vllm/ray-launch.ts";
import { addressSchema, nodeNameSchema } from "../fleet/agent-protocol.ts";
import { parseWith } from "../core/errors.ts";
import { AGENT_FEATURES } from "../fleet/fleet-types.ts";
import { detectInventory, parseLabels, readInventoryFile } from "../agent/inventory.ts";
import { stopAllSupervisors } from "../agent/engine-supervisor.ts";
import { stopOnSignals } from "./shutdown.ts";
import { HttpAssignments } from "../agent/http-assignments.ts";
import { NodeAgent, type SupervisorTimings } from "../agent/node-agent.ts";
import { readNodeIdentity, writeNodeIdentity } from "../agent/node-identity.ts";
import { NodeWeights } from "../agent/node-weights.ts";
import { WeightCache } from "../agent/weight-cache.ts";
import { WeightsIdentity } from "../agent/weights-identity.ts";

export interface AgentCommandOptions {
  server?: string;
  joinToken?: string;
  name?: string;
  dataDir?: string;
  advertise?: string;
  inventory?: string;
  labels?: string;
  llamaServer?: string;
  vllm?: string;
  ray?: string;
  logFormat?: string;
}

/**
 * Shorter supervisor timings, for tests that cannot wait minutes for backoff and parking:
 * JSON like {"backoffMs":[50,200],"parkAfter":[3,60000],"readyTimeoutMs":60000}.
 */
export const AGENT_TIMINGS_ENV = "LLMGW_AGENT_TIMINGS";

export async function runAgentCommand(options: AgentCommandOptions): Promise<void> {
  const logger = createLogger(options.logFormat === undefined ? {} : { format: parseLogFormat(options.logFormat) });
  const servers = parseServerList(options.server ?? process.env.LLMGW_SERVER);
  const serverList = servers.join(",");
  const dataDir = path.resolve(options.dataDir ?? process.env.LLMGW_AGENT_DATA_DIR ?? path.join(os.homedir(), ".llmgw-agent"));
  const name = parseWith(nodeNameSchema, options.name ?? defaultNodeName(), "--name");
  const remote = servers.find((server) => !isLoopback(new URL(server).hostname));
  if (options.advertise === undefined && remote !== undefined) {
    // The gateway would dial 127.0.0.1 on its own machine, reaching whatever listens there.
    throw new BadRequestError(
      `The server ${remote} is on another machine: pass --advertise with this node's address as that server reaches it (engines bind to it).`,
      {
        code: "advertise_missing",
      },
    );
  }
  const address = parseWith(addressSchema, options.advertise ?? "127.0.0.1", "--advertise");
  const labels = options.labels === undefined ? {} : parseLabels(options.labels);
  // vLLM over several nodes runs on Ray, which comes with vLLM's install.
  const ray = options.ray ?? "ray";
  // `auto`: the llama-server `llmgw engine build` made for the bundled llama.cpp's commit.
  const llamaServer = options.llamaServer === "auto" ? await builtLlamaServer() : options.llamaServer;
  const engines: NodeEngines = { ...(llamaServer ? { llamaServer } : {}), ...(options.vllm ? { vllm: options.vllm } : {}) };
  const inventory = {
    ...(options.inventory !== undefined ? await readInventoryFile(path.resolve(options.inventory)) : await detected(engines, logger)),
    features: AGENT_FEATURES,
  };

  const assignments = new HttpAssignments(servers, {
    onSwitch: (from, to, why) => logger.info({ from, to, why }, "switched to another llmgw server of the cluster"),
  });
  let identity = readNodeIdentity(dataDir);
  // The servers of one cluster share the node: any list that holds the one it joined through will do.
  if (identity !== null && !servers.includes(identity.server)) {
    throw new BadRequestError(
      `The agent data dir ${dataDir} belongs to a node that joined through ${identity.server}, which is not in --server (${serverList}). ` +
        `Include ${identity.server} in --server (for example --server ${[identity.server, ...servers].join(",")} when these servers form one cluster), or run this agent with another --data-dir.`,
      { code: "node_of_another_server" },
    );
  }
  if (identity !== null && identity.name !== name && options.name !== undefined) {
    throw new BadRequestError(
      `The agent data dir ${dataDir} holds node '${identity.name}', not '${name}'. Drop --name, or give this node its own --data-dir.`,
      { code: "node_name_differs" },
    );
  }
  if (identity === null) {
    const joinToken = options.joinToken ?? process.env.LLMGW_JOIN_TOKEN;
    if (joinToken === undefined || joinToken === "") {
      throw new BadRequestError(`This node has not joined yet: pass --join-token (from the server's data dir, join.token, or 'llmgw ctl node join-token').`, {
        code: "join_token_missing",
      });
    }
    const joined = await assignments.join({ joinToken, name, address, inventory, labels });
    // The server that took the join, after any failover: the one later starts must list.
    identity = { server: assignments.current, servers, nodeId: joined.nodeId, name: joined.name, credential: joined.credential };
    writeNodeIdentity(dataDir, identity);
    logger.info({ node: joined.name, nodeId: joined.nodeId, server: identity.server }, "joined the fleet");
  } else if (identity.servers?.join(",") !== serverList) {
    identity = { ...identity, servers };
    writeNodeIdentity(dataDir, identity);
  }
  const credential = identity.credential;
  const weightsRoot = path.join(dataDir, "weights");
  const weightsIdentity = new WeightsIdentity({ memoFile: path.join(dataDir, "weights-verified.json"), cacheRoot: weightsRoot, logger });
  const cache = new WeightCache({ root: weightsRoot, serverUrl: () => assignments.current, credential: () => credential, identity: weightsIdentity, logger });
  const agent = new NodeAgent({
    assignments,
    credential,
    name: identity.name,
    address,
    inventory,
    labels,
    stateRoot: path.join(dataDir, "runs"),
    weights: new NodeWeights({ cache, identity: weightsIdentity }),
    launch: async ({ assignment, part, weightsPath, projectorPath, adapterPaths, host, port, attempt, stateDir, rayAddress }) => {
      if (part === "ray-head")
        return rayHeadLaunch({ executable: ray, host, port, stateDir, gpus: assignment.gpus, gcsPort: Number(rayAddress!.split(":").at(-1)) });
      if (part === "ray-worker") return rayWorkerLaunch({ executable: ray, host, port, stateDir, gpus: assignment.gpus, headAddress: rayAddress! });
      return engineLaunch({
        profile: assignment.profile,
        modelName: assignment.modelName,
        weightsPath,
        ...(projectorPath === undefined ? {} : { projectorPath }),
        ...(adapterPaths === undefined
          ? {}
          : {
              adapters: (assignment.adapters ?? []).map((adapter, index) => ({
                servedName: adapter.servedName,
                path: adapterPaths[index]!,
                ...(adapter.rank === undefined ? {} : { rank: adapter.rank }),
              })),
            }),
        engineKey: assignment.engineKey,
        attempt: { attempt, host, port, stateDir },
        engines,
        gpus: assignment.gpus,
        ...(rayAddress === undefined ? {} : { rayAddress }),
        ...(assignment.profile.engine === "vllm" && assignment.profile.ctx_size !== undefined ? { maxModelLen: assignment.profile.ctx_size } : {}),
        ...(assignment.profile.embeddings === true && engineFor(assignment.profile, engines) === "llama-server"
          ? { modelDeclaresPooling: await modelDeclaresPooling(weightsPath) }
          : {}),
      });
    },
    logger,
    supervisor: timingsFromEnv(),
    onDismissed: (error) => {
      process.stderr.write(`error: ${error.message}\n`);
      void stopAllSupervisors().finally(() => process.exit(1));
    },
  });
  agent.start();
  // Before the line that says it runs: a signal after it must get the orderly stop.
  stopOnSignals({
    logger,
    stop: async () => {
      await agent.stop();
      await Promise.all([cache.close(), assignments.close()]);
    },
  });
  process.stdout.write(`llmgw agent: node '${identity.name}' of ${serverList}, engines reachable at ${address}\n`);
}

async function detected(engines: NodeEngines, logger: Logger) {
  const { inventory, warnings } = await detectInventory({
    ...(engines.llamaServer ? { llamaServerPath: engines.llamaServer } : {}),
    ...(engines.vllm ? { vllmPath: engines.vllm } : {}),
  });
  for (const warning of warnings) logger.warn(warning);
  return inventory;
}

/**
 * `--server`: one server URL, or the servers of one cluster separated by commas, as their
 * origins in the order given, duplicates dropped.
 */
export function parseServerList(value: string | undefined): string[] {
  if (value === undefined || value.trim() === "") {
    throw new BadRequestError(
      "Pass --server URL (or LLMGW_SERVER): the llmgw server this node joins, for example http://10.0.0.5:8700, or several servers of one cluster: http://10.0.0.5:8700,http://10.0.0.6:8700.",
      {
        code: "server_missing",
      },
    );
  }
  const entries = value.split(",").map((entry) => entry.trim());
  const empty = entries.indexOf("");
  if (empty !== -1) {
    throw new BadRequestError(
      `Invalid --server '${value}': entry ${empty + 1} is empty. Separate the server URLs with single commas, for example http://10.0.0.5:8700,http://10.0.0.6:8700.`,
      {
        code: "invalid_server",
      },
    );
  }
  return [...new Set(entries.map(parseServerUrl))];
}

/** One server URL, as its origin (the agent's paths are added to it). */
export function parseServerUrl(value: string): string {
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    throw new BadRequestError(`Invalid --server '${value}': give the server's URL, for example http://10.0.0.5:8700.`, { code: "invalid_server" });
  }
  if (url.protocol !== "http:" && url.protocol !== "https:")
    throw new BadRequestError(`Invalid --server '${value}': use http:// or https://.`, { code: "invalid_server" });
  return url.origin;
}

function isLoopback(host: string): boolean {
  return host === "localhost" || host === "[::1]" || host === "::1" || host.startsWith("127.");
}

function defaultNodeName(): string {
  const cleaned = os
    .hostname()
    .replace(/[^A-Za-z0-9._-]/g, "-")
    .replace(/^[^A-Za-z0-9]+/, "")
    .slice(0, 63);
  return cleaned === "" ? "node" : cleaned;
}

function timingsFromEnv(): SupervisorTimings | undefined {
  const raw = process.env[AGENT_TIMINGS_ENV];
  if (raw === undefined || raw === "") return undefined;
  try {
    const parsed = JSON.parse(raw) as {
      backoffMs?: [number, number];
      parkAfter?: [number, number];
      readyTimeoutMs?: number;
      stopGraceMs?: number;
      healthIntervalMs?: number;
    };
    return {
      ...(parsed.backoffMs ? { backoff: { initialMs: parsed.backoffMs[0], maxMs: parsed.backoffMs[1] } } : {}),
      ...(parsed.parkAfter ? { parkAfter: { failures: parsed.parkAfter[0], windowMs: parsed.parkAfter[1] } } : {}),
      ...(parsed.readyTimeoutMs ? { readyTimeoutMs: parsed.readyTimeoutMs } : {}),
      ...(parsed.stopGraceMs ? { stopGraceMs: parsed.stopGraceMs } : {}),
      ...(parsed.healthIntervalMs ? { healthIntervalMs: parsed.healthIntervalMs } : {}),
    };
  } catch (error) {
    throw new LlmgwError({ status: 400, code: "invalid_timings", message: `${AGENT_TIMINGS_ENV} is not valid JSON: ${describeError(error)}` });
  }
}
