// The catalog entry a serve job adds: profiles from the hardware asked for (or what the
// plan recommends), the context pool split into parallel requests, scaling from the
// replicas asked for, the mirror location as the weights source, the origin with each
// verified file, and the LoRA adapters with their mirror locations. Pure functions: the job decides in its registry step, before any byte
// moves, so a request that cannot run anywhere is refused then.
import { BadRequestError } from "../core/errors.ts";
import { formatBytes } from "../core/format.ts";
import { DEFAULT_CONTEXT_PER_REQUEST, DEFAULT_CONTEXT_POOL } from "../catalog/model-schema.ts";
import type { Placement, PlanOption } from "../plan/plan.ts";
import type { ServeRequest } from "./serve-request.ts";

export type WeightsFormat = "gguf" | "safetensors";

type GpuShape = { class: string; gpus_per_node: number; nodes: number };

/** A profile as the catalog takes it (model-schema.ts). */
export interface ServeProfile {
  name: string;
  engine: "llamacpp" | "vllm";
  priority: number;
  ctx_size?: number;
  parallel?: number;
  hardware: { cpu?: { cores?: number }; gpu?: GpuShape };
}

export interface OriginFile {
  path: string;
  sha256: string;
  bytes: number;
}

const GUARD_FORMAT_NAMES = { llamaguard3: "llama-guard-3", shieldgemma: "shieldgemma", json: "json" } as const;

/** The llama.cpp context settings of a request: the pool and how many requests share it. */
export function contextSettings(request: Pick<ServeRequest, "ctx_pool" | "context">): { pool: number; perRequest: number; parallel: number } {
  const pool = request.ctx_pool ?? DEFAULT_CONTEXT_POOL;
  const perRequest = request.context ?? Math.min(DEFAULT_CONTEXT_PER_REQUEST, pool);
  return { pool, perRequest, parallel: Math.max(1, Math.floor(pool / perRequest)) };
}

/**
 * The profiles for the weights, first choice first. Without hardware in the request, the
 * plan's recommendation for this artifact decides; with `fallbacks`, the other ways the
 * plan can run the same artifact follow at lower priority.
 */
export function chooseProfiles(input: {
  request: Pick<ServeRequest, "hardware" | "fallbacks" | "ctx_pool" | "context">;
  format: WeightsFormat;
  planOptions: readonly PlanOption[];
  artifactId: string | null;
}): ServeProfile[] {
  const { request, format } = input;
  const sameArtifact = input.planOptions.filter(
    (option) => input.artifactId !== null && option.artifact.id === input.artifactId && option.artifact.format === format,
  );
  const recommended = sameArtifact.find((option) => option.fits)?.placement ?? null;
  const asked: Placement | null =
    request.hardware === undefined
      ? null
      : "cpu" in request.hardware
        ? { kind: "cpu" }
        : { kind: "gpu", gpuClass: request.hardware.gpu.class, gpusPerNode: request.hardware.gpu.gpus_per_node, nodes: request.hardware.gpu.nodes };
  const first = asked ?? recommended ?? (format === "gguf" ? { kind: "cpu" as const } : null);
  if (first === null || (format === "safetensors" && first.kind === "cpu")) {
    throw new BadRequestError(
      "The picked weights are original (safetensors) weights, which run on vLLM on GPUs and never on the CPU, and the plan found no GPU for them. " +
        "Give the GPU they run on (--gpu-class C --gpus-per-node N), or serve a GGUF quantisation of the model (--format gguf, from a GGUF repository).",
      { code: "needs_gpu", param: "hardware" },
    );
  }
  const placements: Placement[] = [first];
  if (request.fallbacks) {
    for (const option of sameArtifact) if (!placements.some((p) => samePlacement(p, option.placement))) placements.push(option.placement);
    // A GGUF can always fall back to the CPU; original weights never do.
    if (format === "gguf" && !placements.some((p) => p.kind === "cpu")) placements.push({ kind: "cpu" });
  }
  const { pool, parallel } = contextSettings(request);
  const cores = request.hardware !== undefined && "cpu" in request.hardware ? request.hardware.cpu.cores : undefined;
  const names = new Set<string>();
  return placements
    .filter((placement) => !(format === "safetensors" && placement.kind === "cpu"))
    .map((placement, index) => {
      const base =
        placement.kind === "cpu" ? "cpu" : `gpu-${placement.gpuClass.toLowerCase().replace(/[^a-z0-9]+/g, "")}-${placement.gpusPerNode}x${placement.nodes}`;
      let name = base;
      for (let n = 2; names.has(name); n += 1) name = `${base}-${n}`;
      names.add(name);
      return {
        name,
        engine: format === "gguf" ? ("llamacpp" as const) : ("vllm" as const),
        priority: index === 0 ? 0 : -index,
        ...(format === "gguf" ? { ctx_size: pool, parallel } : {}),
        hardware:
          placement.kind === "cpu"
            ? { cpu: cores === undefined ? {} : { cores } }
            : { gpu: { class: placement.gpuClass, gpus_per_node: placement.gpusPerNode, nodes: placement.nodes } },
      };
    });
}

function samePlacement(a: Placement, b: Placement): boolean {
  if (a.kind === "cpu" || b.kind === "cpu") return a.kind === b.kind;
  return a.gpuClass.toLowerCase() === b.gpuClass.toLowerCase() && a.gpusPerNode === b.gpusPerNode && a.nodes === b.nodes;
}

export function describeProfiles(profiles: readonly ServeProfile[]): string {
  return profiles
    .map((p) =>
      p.hardware.gpu === undefined
        ? `${p.engine} on CPU`
        : `${p.engine} on ${p.hardware.gpu.gpus_per_node}× ${p.hardware.gpu.class}${p.hardware.gpu.nodes > 1 ? ` × ${p.hardware.gpu.nodes} nodes` : ""}`,
    )
    .join(", then ");
}

/**
 * The description a served model is given: its repository, revision and size. An update
 * writes it again for the new revision when the model still has the one it was given
 * (update-job.ts); a description someone wrote stays theirs.
 */
export function servedDescription(origin: { repo: string; revision: string; files: readonly OriginFile[] }): string {
  const bytes = origin.files.reduce((sum, file) => sum + file.bytes, 0);
  return `Served from ${origin.repo} at ${origin.revision.slice(0, 12)} (${formatBytes(bytes)}).`;
}

/**
 * Whether a description is one `servedDescription` wrote for this repository, at any
 * revision. An update compares with this rather than with the description of the origin
 * it replaces: a model an older llmgw updated kept the description of its first revision
 * while its origin moved on, and an exact match would leave that stale text for ever.
 */
export function isServedDescription(description: string | undefined, repo: string): boolean {
  if (description === undefined) return false;
  const prefix = `Served from ${repo} at `;
  if (!description.startsWith(prefix)) return false;
  // The rest is what servedDescription writes after the repository: a revision of at most
  // twelve characters and the size as formatBytes prints it.
  return /^[^\s()]{1,12} \(\d+(?:\.\d)? (?:B|KiB|MiB|GiB)\)\.$/.test(description.slice(prefix.length));
}

/** A served adapter as the catalog takes it (model-schema.ts `adapters`): a file of its repository's mirror version. */
export interface ServeAdapter {
  name: string;
  scale?: number;
  source: { kind: "mirror"; model: string; version: string; file: string };
}

/** The body `Catalog.create` takes for a served repository. */
export function serveModelBody(input: {
  request: ServeRequest & { name: string };
  profiles: ServeProfile[];
  source: { kind: "mirror"; model: string; version: string; file: string; projector?: string };
  origin: { repo: string; revision: string; ref?: string; files: OriginFile[] };
  adapters?: readonly ServeAdapter[];
}): Record<string, unknown> {
  const { request } = input;
  const replicas = request.replicas;
  return {
    name: request.name,
    aliases: request.aliases,
    description: servedDescription(input.origin),
    profiles: input.profiles,
    scaling: replicas === 0 ? { min: 0, max: 1 } : { min: replicas, max: replicas },
    ...(request.guard_format === undefined ? {} : { role: "guard", guard_format: GUARD_FORMAT_NAMES[request.guard_format] }),
    source: input.source,
    origin: input.origin,
    ...(input.adapters === undefined || input.adapters.length === 0 ? {} : { adapters: input.adapters }),
    // A projector is what lets llama-server take images: the gateway lets image parts through to it.
    ...(input.source.projector === undefined ? {} : { capabilities: { vision: true, embeddings: false } }),
  };
}
