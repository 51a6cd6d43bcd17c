// Text rendering of a plan for `llmgw ctl model plan`: one row per option, a note for each
// option that does not fit, then the recommendation or, when nothing fits, the explanation.
import { formatBytes } from "../gguf/memory-estimate.ts";
import { describePlacement, type ModelPlan } from "./plan.ts";
import { renderTable } from "../core/text-table.ts";

const COLUMNS = ["artifact", "format", "engine", "where", "needs", "available", "hosts", "fits"] as const;

export function renderPlanTable(plan: ModelPlan): string {
  const rows = plan.options.map((option) => {
    const unit = option.per === "gpu" ? "/GPU" : "/node";
    return [
      option.artifact.label,
      option.artifact.format,
      option.engine === "vllm" ? "vLLM" : "llama.cpp",
      describePlacement(option),
      `${formatBytes(option.neededBytes)}${unit}`,
      option.placement.kind === "gpu" && option.placement.gpuClass === "none" ? "none" : `${formatBytes(option.availableBytes)}${unit}`,
      String(option.hostsNow),
      option.fits ? "yes" : "no",
    ];
  });
  const lines = [`Plan for a ${plan.contextSize}-token context`, "", renderTable(COLUMNS, rows)];
  const notes = plan.options.filter((option) => !option.fits && option.why !== undefined);
  if (notes.length > 0) {
    lines.push("", "Does not fit:");
    for (const option of notes) lines.push(`  ${option.artifact.label} on ${describePlacement(option)}: ${option.why}`);
  }
  lines.push("", plan.explanation);
  return `${lines.join("\n")}\n`;
}
