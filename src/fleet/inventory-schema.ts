// What a node may claim about itself. An agent sends its inventory (cores, memory, GPUs,
// engines) and labels when it joins and with its heartbeats; placement trusts those
// numbers to decide where replicas go, so the server checks them at the door: a node that
// claims zero cores, a 2 PB GPU or the same GPU twice is refused with the field named,
// instead of attracting replicas it cannot run. The agent runs the same check on an
// `--inventory FILE` before it joins, so a typo fails on the node, not on the server.
//
// The wire form is NodeInventory of fleet-types.ts as it is (camelCase, bytes as numbers).
// Unknown fields are dropped rather than refused: an agent newer than the server may
// report more, and the server uses what it knows.
import { z } from "zod";
import { BadRequestError } from "../core/errors.ts";
import { formatBytes, printable } from "../core/format.ts";
import type { NodeInventory, NodeLabels } from "./fleet-types.ts";

const MiB = 1024 ** 2;
const TiB = 1024 ** 4;

/**
 * Bounds of a believable node. They refuse typos and corrupt reports, not hardware:
 * - cores: 4096 is Linux's largest default NR_CPUS (x86_64 MAXSMP builds allow 8192, but
 *   no machine that runs an LLM agent ships with more than a few hundred).
 * - memory: below 64 MiB not even the agent runs; 64 TiB is above the largest single
 *   machines sold (32 TiB).
 * - a GPU: some memory, at most 1 TiB (the largest today have under 300 GB).
 * - 64 GPUs: nvidia-smi indexes them from 0, and the largest single nodes carry 16.
 */
export const INVENTORY_LIMITS = {
  cores: { min: 1, max: 4096 },
  memoryBytes: { min: 64 * MiB, max: 64 * TiB },
  gpuMemoryBytes: { min: 1, max: 1 * TiB },
  gpus: { max: 64 },
  nameLength: 256,
  classLength: 64,
  versionLength: 200,
} as const;

export const ENGINE_NAMES = ["llamacpp", "llama-server", "vllm"] as const;

/**
 * Label keys as Kubernetes writes them: 1 to 63 letters, digits, `.`, `_`, `/` and `-`,
 * beginning and ending with a letter or digit. The ends also keep out "__proto__", which a
 * JavaScript object would swallow instead of storing as a label.
 */
export const LABEL_KEY_PATTERN = /^[A-Za-z0-9](?:[A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?$/;
/** Label values: the same, with `:` too (a value is printed in `ctl node list`). */
export const LABEL_VALUE_PATTERN = /^[A-Za-z0-9](?:[A-Za-z0-9._/:-]{0,61}[A-Za-z0-9])?$/;
export const LABEL_KEY_RULE = "1-63 letters, digits, '.', '_', '/' or '-', beginning and ending with a letter or digit";
export const LABEL_VALUE_RULE = "1-63 letters, digits, '.', '_', '/', ':' or '-', beginning and ending with a letter or digit";
export const MAX_LABELS = 64;

const wholeNumber = z.number({ error: "must be a number" }).int({ error: (issue) => `must be a whole number, got ${String(issue.input)}` });
const text = (maxLength: number) =>
  z
    .string({ error: "must be a string" })
    .refine((value) => value.trim() !== "", { error: "must not be empty" })
    .refine((value) => value.length <= maxLength, { error: `must be at most ${maxLength} characters` });

const gpuSchema = z.object({
  index: wholeNumber,
  name: text(INVENTORY_LIMITS.nameLength),
  class: text(INVENTORY_LIMITS.classLength),
  memoryBytes: wholeNumber,
});

const engineSchema = z.object({
  engine: z.enum(ENGINE_NAMES, { error: (issue) => `must be one of ${ENGINE_NAMES.join(", ")}, got ${describeValue(issue.input)}` }),
  version: text(INVENTORY_LIMITS.versionLength),
});

export const nodeInventorySchema = z
  .object({
    cores: wholeNumber,
    memoryBytes: wholeNumber,
    gpus: z.array(gpuSchema, { error: "must be a list of GPUs (empty for none)" }),
    engines: z.array(engineSchema, { error: "must be a list of engines" }),
    features: z.array(text(INVENTORY_LIMITS.nameLength), { error: "must be a list of feature names" }).max(32).optional(),
  })
  .superRefine((inventory, ctx) => {
    const { cores, memoryBytes, gpuMemoryBytes, gpus } = INVENTORY_LIMITS;
    if (inventory.cores < cores.min || inventory.cores > cores.max) {
      ctx.addIssue({ code: "custom", path: ["cores"], message: `must be from ${cores.min} to ${cores.max}, got ${inventory.cores}` });
    }
    if (inventory.memoryBytes < memoryBytes.min || inventory.memoryBytes > memoryBytes.max) {
      ctx.addIssue({
        code: "custom",
        path: ["memoryBytes"],
        message: `must be from ${sizeText(memoryBytes.min)} to ${sizeText(memoryBytes.max)}, got ${inventory.memoryBytes} bytes`,
      });
    }
    if (inventory.gpus.length > gpus.max) {
      ctx.addIssue({ code: "custom", path: ["gpus"], message: `lists ${inventory.gpus.length} GPUs; a node has at most ${gpus.max}` });
    }
    const seenIndexes = new Set<number>();
    inventory.gpus.forEach((gpu, position) => {
      if (gpu.index < 0 || gpu.index >= gpus.max) {
        ctx.addIssue({
          code: "custom",
          path: ["gpus", position, "index"],
          message: `must be from 0 to ${gpus.max - 1} (nvidia-smi's index), got ${gpu.index}`,
        });
      } else if (seenIndexes.has(gpu.index)) {
        ctx.addIssue({ code: "custom", path: ["gpus", position, "index"], message: `GPU index ${gpu.index} is listed twice; each GPU has its own index` });
      }
      seenIndexes.add(gpu.index);
      if (gpu.memoryBytes < gpuMemoryBytes.min || gpu.memoryBytes > gpuMemoryBytes.max) {
        ctx.addIssue({
          code: "custom",
          path: ["gpus", position, "memoryBytes"],
          message: `must be more than 0 and at most ${sizeText(gpuMemoryBytes.max)}, got ${gpu.memoryBytes} bytes`,
        });
      }
    });
    if (inventory.engines.length === 0) {
      ctx.addIssue({ code: "custom", path: ["engines"], message: "must list at least one engine (every agent has the bundled llamacpp)" });
    }
    const seenEngines = new Set<string>();
    inventory.engines.forEach((engine, position) => {
      if (seenEngines.has(engine.engine)) {
        ctx.addIssue({
          code: "custom",
          path: ["engines", position, "engine"],
          message: `${engine.engine} is listed twice; give each engine once with its version`,
        });
      }
      seenEngines.add(engine.engine);
    });
  });

/**
 * The inventory a node reports, checked: throws a BadRequestError with code
 * `invalid_inventory` whose `param` and message name the first impossible field.
 * `what` names the source in the message ("node inventory", "inventory file /etc/x.json").
 */
export function checkInventory(raw: unknown, what = "node inventory"): NodeInventory {
  const result = nodeInventorySchema.safeParse(raw);
  if (!result.success) throw inventoryError(result.error, what);
  return result.data;
}

export const nodeLabelsSchema = z
  .record(z.string().regex(LABEL_KEY_PATTERN, `label keys are ${LABEL_KEY_RULE}`), z.string().regex(LABEL_VALUE_PATTERN, `must be ${LABEL_VALUE_RULE}`))
  .refine((labels) => Object.keys(labels).length <= MAX_LABELS, { error: `a node has at most ${MAX_LABELS} labels` });

/** A node's labels as they arrive from an agent; throws a BadRequestError (`invalid_labels`) naming the label. */
export function checkLabels(raw: unknown, what = "node labels"): NodeLabels {
  const result = nodeLabelsSchema.safeParse(raw);
  if (!result.success) throw inventoryError(result.error, what, "invalid_labels");
  return result.data;
}

function inventoryError(error: z.ZodError, what: string, code = "invalid_inventory"): BadRequestError {
  const issue = error.issues[0];
  const path = issue ? issue.path.map(String).join(".") : "";
  const reason = issue?.message ?? "invalid";
  const where = path === "" ? "" : ` field '${path}':`;
  return new BadRequestError(`Invalid ${what}:${where} ${reason}.`, { code, param: path === "" ? null : path, cause: error });
}

/** formatBytes, but the limits in TiB read as TiB ("64 TiB", not "65536.0 GiB"). */
function sizeText(bytes: number): string {
  return bytes >= TiB && bytes % TiB === 0 ? `${bytes / TiB} TiB` : formatBytes(bytes);
}

function describeValue(value: unknown): string {
  return typeof value === "string" ? `'${printable(value)}'` : String(value);
}
