// Text rendering of a plan for `llmgw ctl model plan`: one row per option, what each
// artifact's memory is made of (weights, KV cache, compute buffer and the stage that sized
// it), a note for each option that does not fit, the warnings of the estimates (a context
// beyond the trained one), then the recommendation or, when nothing fits, the explanation.
// It shows what the JSON of GET /api/v1/plan holds, so a person reading the text is told
// no less than a script reading the JSON. The cores column and the line under the table
// show the core-share rule (cpu-share.ts) the fleet places CPU replicas by.
//
// It imports the planner (plan.ts); the planner never imports it, so the two form no cycle.
import { formatBytes } from "../gguf/memory-estimate.ts";
import { CORE_SHARE_RULE, formatCores } from "./cpu-share.ts";
import { describePlacement, type ModelPlan, type PlanArtifact } from "./plan.ts";
import { renderTable } from "../core/text-table.ts";

const COLUMNS = ["artifact", "format", "engine", "where", "needs", "cores", "available", "hosts", "fits"] as const;

export function renderPlanTable(plan: ModelPlan): string {
  const rows = plan.options.map((option) => {
    const unit = option.per === "gpu" ? "/GPU" : "/node";
    return [
      option.artifact.label,
      option.artifact.format,
      option.engine === "vllm" ? "vLLM" : "llama.cpp",
      describePlacement(option),
      `${formatBytes(option.neededBytes)}${unit}`,
      `${formatCores(option.cores)}/node`,
      option.placement.kind === "gpu" && option.placement.gpuClass === "none" ? "none" : `${formatBytes(option.availableBytes)}${unit}`,
      String(option.hostsNow),
      option.fits ? "yes" : "no",
    ];
  });
  const lines = [`Plan for a ${plan.contextSize}-token context`, "", renderTable(COLUMNS, rows)];
  if (plan.artifacts.length > 0) {
    lines.push("", "Memory each artifact needs (before a split across GPUs):");
    for (const artifact of plan.artifacts) lines.push(`  ${artifact.label}: ${describeMemory(artifact)}`);
  }
  if (plan.options.some((option) => option.placement.kind === "cpu")) lines.push("", CORE_SHARE_RULE);
  const notes = plan.options.filter((option) => !option.fits && option.why !== undefined);
  if (notes.length > 0) {
    lines.push("", "Does not fit:");
    for (const option of notes) lines.push(`  ${option.artifact.label} on ${describePlacement(option)}: ${option.why}`);
  }
  // Every quantisation of a repository has the same trained context: say it once.
  const warnings = [...new Set(plan.artifacts.flatMap((artifact) => (artifact.memory.engine === "llamacpp" ? artifact.memory.warnings : [])))];
  if (warnings.length > 0) lines.push("", ...warnings.map((warning) => `Warning: ${warning}`));
  lines.push("", plan.explanation);
  return `${lines.join("\n")}\n`;
}

/** What an artifact's memory is made of, as the estimate counted it. */
function describeMemory(artifact: PlanArtifact): string {
  const memory = artifact.memory;
  if (memory.engine === "llamacpp") {
    const { computeBytes, computeStageName, outputBytes, fixedBytes } = memory.overhead;
    return (
      `weights ${formatBytes(memory.weightsBytes)} + KV cache ${formatBytes(memory.kvCacheBytes)} (${memory.allocatedContext} tokens, ${memory.kvType})` +
      ` + compute buffer ${formatBytes(computeBytes)} (${computeStageName}) + output buffer and tokenizer ${formatBytes(outputBytes + fixedBytes)}` +
      ` = ${formatBytes(memory.totalBytes)} on llama.cpp`
    );
  }
  const runtimeBytes = memory.withKvBytes - memory.weightsBytes - memory.kvCacheBytes;
  return (
    `weights ${formatBytes(memory.weightsBytes)} + KV cache ${formatBytes(memory.kvCacheBytes)} (one ${memory.contextSize}-token sequence) + runtime ${formatBytes(runtimeBytes)}` +
    ` = ${formatBytes(memory.withKvBytes)}; GPUStack's rule, weights × 1.2 + runtime, = ${formatBytes(memory.ruleOfThumbBytes)}; the larger, ${formatBytes(memory.totalBytes)}, on vLLM`
  );
}
