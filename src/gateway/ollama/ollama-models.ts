// How a catalog model looks in Ollama's model routes (/api/tags, /api/show, /api/ps): the
// entry of the model list with its details, and what show says about it. Ollama describes
// a model by its local blob; llmgw describes it by its catalog entry and the weights its
// origin recorded, and leaves empty what it does not know (Ollama's clients take "" for
// an unknown detail). Which models a key sees is model-access.ts's rule, as on /v1/models.
import { createHash } from "node:crypto";
import path from "node:path";
import type { CatalogModel } from "../../catalog/catalog.ts";
import type { ModelResolver } from "../gateway-ports.ts";
import type { Principal } from "../../keys/key-service.ts";
import { listModels } from "../model-access.ts";

export interface OllamaModelDetails {
  parent_model: string;
  format: string;
  family: string;
  families: string[];
  parameter_size: string;
  quantization_level: string;
}

export interface OllamaModelEntry {
  name: string;
  model: string;
  modified_at: string;
  size: number;
  digest: string;
  details: OllamaModelDetails;
}

/**
 * The GGUF architecture is not recorded in the catalog (it is read from the weights when a
 * replica is placed), so show names this one; clients find the context length under
 * `<general.architecture>.context_length`, which it keeps working.
 */
export const UNKNOWN_ARCHITECTURE = "llmgw";

/** Every name `principal` may use, with its model: names, aliases and adapters' names, as /v1/models lists them. */
export function usableNames(catalog: ModelResolver, principal: Principal): Array<{ name: string; model: CatalogModel }> {
  const usable: Array<{ name: string; model: CatalogModel }> = [];
  for (const { id } of listModels(catalog, principal).data) {
    const model = catalog.resolve(id);
    if (model !== undefined) usable.push({ name: id, model });
  }
  return usable;
}

/** The file name of the model's weights, when its source names one. */
function weightsFileName(model: CatalogModel): string | undefined {
  const source = model.definition.source;
  if (source === undefined) return undefined;
  return source.kind === "mirror" ? source.file : source.path;
}

/** The origin's record of the weights file: the one the source names, else the largest. */
function weightsFile(model: CatalogModel): { path: string; sha256: string; bytes: number } | undefined {
  const files = model.definition.origin?.files ?? [];
  const named = weightsFileName(model);
  const base = named === undefined ? undefined : path.basename(named);
  const match = files.find((file) => file.path === named || path.basename(file.path) === base);
  return match ?? [...files].sort((a, b) => b.bytes - a.bytes)[0];
}

/** Ollama's format: the weights' file format of the engines that run the model. */
function formatOf(model: CatalogModel): string {
  const engines = new Set(model.definition.profiles.map((profile) => profile.engine));
  if (engines.has("llamacpp")) return "gguf";
  if (engines.has("vllm")) return "safetensors";
  return "";
}

// llama.cpp's quantization types as GGUF file names carry them: Q4_K_M, Q8_0, IQ4_XS, TQ1_0, F16, BF16, F32.
const QUANTIZATION = /(?:^|[-_.])((?:[IT]?Q\d+(?:_(?:[0-9]+|K|L|M|S|XS|XXS|NL))*)|BF16|F16|F32)(?=[-_.]|$)/gi;

/** The quantization a GGUF file's name states, or "". */
export function quantizationOf(fileName: string | undefined): string {
  if (fileName === undefined) return "";
  const stem = path.basename(fileName).replace(/\.gguf$/i, "");
  const found = [...stem.matchAll(QUANTIZATION)].at(-1)?.[1];
  return found === undefined ? "" : found.toUpperCase();
}

export function detailsOf(model: CatalogModel): OllamaModelDetails {
  const format = formatOf(model);
  return {
    parent_model: "",
    format,
    family: "",
    families: [],
    parameter_size: "",
    quantization_level: format === "gguf" ? quantizationOf(weightsFileName(model) ?? weightsFile(model)?.path) : "",
  };
}

/** One entry of /api/tags, under the name the key uses. */
export function modelEntry(name: string, model: CatalogModel): OllamaModelEntry {
  const files = model.definition.origin?.files ?? [];
  // The weights' own sha256 where the origin recorded it (Ollama's digest is its blob's
  // sha256); else a stable one of the model's id, so a client that keys on it sees one model.
  const digest = weightsFile(model)?.sha256 ?? createHash("sha256").update(model.id).digest("hex");
  return {
    name,
    model: name,
    modified_at: model.updated_at,
    size: files.reduce((sum, file) => sum + file.bytes, 0),
    digest,
    details: detailsOf(model),
  };
}

/**
 * What a model can do, in Ollama's words. A model whose every engine profile is a
 * dedicated embedding replica (profile.embeddings) embeds and does nothing else; any
 * other model completes and takes tools (every engine llmgw runs and every OpenAI-style
 * server takes `tools`).
 */
export function capabilitiesOf(model: CatalogModel): string[] {
  const engineProfiles = model.definition.profiles.filter((profile) => profile.engine !== "external");
  const embeddingOnly = engineProfiles.length > 0 && engineProfiles.every((profile) => profile.embeddings === true);
  const capabilities = embeddingOnly ? [] : ["completion", "tools"];
  if (model.definition.capabilities.vision) capabilities.push("vision");
  if (embeddingOnly || model.definition.capabilities.embeddings) capabilities.push("embedding");
  return capabilities;
}

/**
 * /api/show's answer. No Modelfile, parameters, template or system prompt: llmgw's models
 * have none of their own to show (the engine applies the weights' chat template).
 */
export function showAnswer(model: CatalogModel) {
  const contextLength = model.definition.context_length;
  return {
    license: "",
    modelfile: "",
    parameters: "",
    template: "",
    system: "",
    details: detailsOf(model),
    model_info: {
      "general.architecture": UNKNOWN_ARCHITECTURE,
      ...(contextLength === undefined ? {} : { [`${UNKNOWN_ARCHITECTURE}.context_length`]: contextLength }),
    },
    capabilities: capabilitiesOf(model),
    modified_at: model.updated_at,
  };
}
