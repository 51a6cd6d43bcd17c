// The fleet as the planner sees it: each node that takes replicas, with the cores, memory,
// GPUs and engines it reported. `ctl model plan`, mirror fetches without a quant and serve
// jobs plan against this, so the artifact picked is one the fleet can run; a server with
// no nodes yet plans against its own machine (plan/local-pool.ts).
import type { Pool, PoolNode } from "../plan/plan.ts";
import type { FleetNode } from "./node-registry.ts";

export function fleetPool(nodes: readonly FleetNode[]): Pool | null {
  const ready = nodes.filter((node) => node.state === "ready");
  if (ready.length === 0) return null;
  return { nodes: ready.map(poolNode) };
}

function poolNode(node: FleetNode): PoolNode {
  const { inventory } = node;
  const engine = (name: string) => inventory.engines.find((e) => e.engine === name);
  const bundled = engine("llamacpp");
  const server = engine("llama-server");
  const vllm = engine("vllm");
  const llamacpp = server ?? bundled;
  return {
    name: node.name,
    cores: inventory.cores,
    memoryBytes: inventory.memoryBytes,
    gpus: inventory.gpus.map((gpu) => ({ index: gpu.index, class: gpu.class, memoryBytes: gpu.memoryBytes })),
    engines: {
      // GPU layers need the node's own llama-server; the bundled engine is the CPU build.
      ...(llamacpp === undefined ? {} : { llamacpp: { version: llamacpp.version, gpu: server !== undefined && inventory.gpus.length > 0 } }),
      ...(vllm === undefined ? {} : { vllm: { version: vllm.version } }),
    },
  };
}
