// LoRA adapters in a model definition (DESIGN.md "Adapters"): their shape, the names they
// are served under, and the rules a definition's adapters must keep. model-schema.ts puts
// them in the model's fields; the catalog checks served names once the model's name is known.
import path from "node:path";
import { z } from "zod";
import { BadRequestError } from "../core/errors.ts";
import { modelName } from "./model-name.ts";

/**
 * A LoRA adapter served on the model's replicas under a name of its own (DESIGN.md
 * "Adapters"): a GGUF adapter file for llamacpp profiles (an absolute path on the nodes, or a
 * file of a mirrored version), or a PEFT adapter folder for vllm profiles (a path on the
 * nodes). Its size and sha256 are pinned when the server first reads it, and a node checks
 * them before every engine start, as it does weights.
 */
export const adapterSchema = z.strictObject({
  /** Short name, unique within the model; the served name defaults to MODEL:NAME. */
  name: z.string().regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/, "must be 1-64 letters, digits and . _ -, starting with a letter or digit"),
  /** The model name clients ask for (default MODEL:NAME); unique among all models' names and aliases. */
  served_name: modelName.optional(),
  /** How strongly the adapter applies (llama.cpp's LoRA scale; 1 is as trained). */
  scale: z.number().gt(0).max(8).default(1),
  source: z.discriminatedUnion("kind", [
    z.strictObject({ kind: z.literal("file"), path: z.string().min(1) }),
    z.strictObject({ kind: z.literal("mirror"), model: z.string().min(1), version: z.string().min(1), file: z.string().min(1) }),
  ]),
});

export type AdapterDefinition = z.output<typeof adapterSchema>;

/** The name clients use for an adapter of `model`. */
export function adapterServedName(modelName: string, adapter: { name: string; served_name?: string | undefined }): string {
  return adapter.served_name ?? `${modelName}:${adapter.name}`;
}

/**
 * The adapters' served names against the model's own names, once the model's name is known
 * (a stored definition has none, so the schema cannot see a served name equal to it, nor to
 * another adapter's default MODEL:NAME): a 400 naming the field.
 */
export function assertAdapterNames(modelName: string, definition: { aliases: string[]; adapters: AdapterDefinition[] }): void {
  const taken = new Set<string>([modelName, ...definition.aliases]);
  definition.adapters.forEach((adapter, index) => {
    const served = adapterServedName(modelName, adapter);
    if (taken.has(served)) {
      throw new BadRequestError(
        `adapter '${adapter.name}' would be served as '${served}', which is already the model's name, an alias or another adapter's name; give it another served_name`,
        {
          param: `adapters.${index}.served_name`,
          code: "invalid_field",
        },
      );
    }
    taken.add(served);
  });
}

/** At most this many adapters per model: each is loaded by every replica of the model. */
export const MAX_ADAPTERS = 16;

/** Adapters: unique names, served names that clash with nothing of the model, engines that load them. */
export function checkAdapters(
  model: {
    name?: string;
    role: string;
    aliases: string[];
    profiles: { engine: string; embeddings?: boolean | undefined }[];
    adapters: { name: string; served_name?: string | undefined; source: { kind: string; path?: string } }[];
  },
  ctx: z.RefinementCtx,
): void {
  if (model.adapters.length === 0) return;
  if (model.profiles.some((p) => p.engine === "external")) {
    ctx.addIssue({
      code: "custom",
      path: ["adapters"],
      message: "belong to models that llmgw runs (llamacpp or vllm profiles); an external server serves its own adapters under its own names",
    });
  }
  if (model.role === "guard") {
    // Guards are asked by their model's name through internal calls, which choose no adapter.
    ctx.addIssue({ code: "custom", path: ["adapters"], message: "belong to serving models; a guard model (role guard) takes none" });
  }
  if (model.profiles.some((p) => p.embeddings === true)) {
    ctx.addIssue({ code: "custom", path: ["adapters"], message: "apply to generation; an embedding model (embeddings: true) takes none" });
  }
  const engines = new Set(model.profiles.map((p) => p.engine));
  if (engines.has("llamacpp") && engines.has("vllm")) {
    // One adapter cannot be both: a GGUF file for llama.cpp and a PEFT folder for vLLM.
    ctx.addIssue({ code: "custom", path: ["adapters"], message: "need one kind of engine: a model with both llamacpp and vllm profiles takes no adapters" });
  }
  const names = new Set<string>();
  const served = new Set<string>([...(model.name === undefined ? [] : [model.name]), ...model.aliases]);
  model.adapters.forEach((adapter, index) => {
    if (names.has(adapter.name)) ctx.addIssue({ code: "custom", path: ["adapters", index, "name"], message: `'${adapter.name}' names two adapters` });
    names.add(adapter.name);
    const servedName = model.name === undefined ? adapter.served_name : adapterServedName(model.name, adapter);
    if (servedName !== undefined) {
      if (served.has(servedName)) {
        ctx.addIssue({
          code: "custom",
          path: ["adapters", index, "served_name"],
          message: `'${servedName}' is already the model's name, an alias or another adapter's name`,
        });
      }
      served.add(servedName);
    }
    if (adapter.source.kind === "file" && !path.isAbsolute(adapter.source.path ?? "")) {
      ctx.addIssue({ code: "custom", path: ["adapters", index, "source", "path"], message: "must be an absolute path on the nodes" });
    }
    if (engines.has("vllm") && (adapter as { scale?: number }).scale !== undefined && (adapter as { scale?: number }).scale !== 1) {
      ctx.addIssue({ code: "custom", path: ["adapters", index, "scale"], message: "vLLM applies an adapter as trained: leave scale at 1 for vllm profiles" });
    }
    if (engines.has("vllm") && adapter.source.kind === "mirror") {
      ctx.addIssue({
        code: "custom",
        path: ["adapters", index, "source"],
        message: "vLLM loads a PEFT adapter folder: give its path on the nodes ({kind:'file', path}); mirrored adapters are GGUF files for llama.cpp profiles",
      });
    }
  });
}
