// The door check of a model's LoRA adapters (model-schema.ts `adapters`), run with the
// weights check before the catalog stores a model: each adapter file is there as a regular
// readable file (a mirrored one complete in the mirror), and for llama.cpp profiles it is a
// GGUF LoRA adapter made for this model: the same architecture, embedding size and layers
// (src/gguf/lora-adapter.ts). llama.cpp itself only says "tensor has incorrect shape (maybe
// wrong base model?)" at load, on every node, after placement; here the operator gets both
// values at once. vLLM loads a PEFT adapter folder: a LoRA config of a rank vLLM serves and
// the adapter's weights, as regular files (peft-folder.ts).
import { BadRequestError, describeError } from "../core/errors.ts";
import type { GgufHeaderSummary } from "../gguf/header.ts";
import { checkAdapterFitsModel, readLoraAdapter } from "../gguf/lora-adapter.ts";
import type { ModelDefinition } from "./model-schema.ts";
import { allowsLoraBias, listPeftFolder, readPeftConfig } from "./peft-folder.ts";
import { checkWeightsFile, heldElsewhere, locateWeights, type MirrorLocator } from "./weights-check.ts";

export async function checkAdapters(options: {
  model: { name: string; definition: ModelDefinition };
  /** The model's GGUF header (llama.cpp profiles), which each adapter must fit. */
  header: GgufHeaderSummary | undefined;
  mirror?: MirrorLocator;
  signal?: AbortSignal;
}): Promise<void> {
  const { model, header } = options;
  const { adapters, profiles } = model.definition;
  const llamaCpp = profiles.some((p) => p.engine === "llamacpp");
  for (const [index, adapter] of adapters.entries()) {
    const param = `adapters.${index}.source`;
    const what = `Adapter '${adapter.name}' of model '${model.name}'`;
    if (!llamaCpp) {
      await checkPeftFolder(adapter.source.kind === "file" ? adapter.source.path : "", what, param, allowsLoraBias(profiles));
      continue;
    }
    // Bytes only another running server holds: the leader copies them and checks them against the model (adapter-pins.ts).
    if (await heldElsewhere(options.mirror, adapter.source)) continue;
    const located = await locateWeights({ source: adapter.source, modelName: model.name, ...(options.mirror ? { mirror: options.mirror } : {}) });
    await checkWeightsFile({ file: located.file, modelName: model.name, param, llamaCpp: false, ...(options.signal ? { signal: options.signal } : {}) });
    let info: Awaited<ReturnType<typeof readLoraAdapter>>;
    try {
      info = await readLoraAdapter({ file: located.file, ...(options.signal ? { signal: options.signal } : {}) });
    } catch (error) {
      if (options.signal?.aborted === true) throw options.signal.reason ?? error;
      throw new BadRequestError(`${what} cannot be used: ${describeError(error)}`, { code: "adapter_invalid", param, cause: error });
    }
    const misfit = header === undefined ? null : checkAdapterFitsModel(info, { ...header, source: model.name });
    if (misfit !== null) throw new BadRequestError(`${misfit} Give an adapter trained on this model's base.`, { code: "adapter_mismatch", param });
    // llama-server takes adapters as --lora-scaled PATH:SCALE, split at ',' and ':'.
    if (/[,:]/.test(located.file)) {
      throw new BadRequestError(`${what} is at ${located.file}, whose ',' or ':' llama-server's --lora-scaled cannot take; rename the file.`, {
        code: "adapter_invalid",
        param,
      });
    }
  }
}

/** A LoRA PEFT folder of a rank vLLM serves, with the adapter's weights, and nothing a pin cannot hold (links, too many files). */
async function checkPeftFolder(folder: string, what: string, param: string, allowBias: boolean): Promise<void> {
  await readPeftConfig(folder, what, param, { allowBias });
  const files = await listPeftFolder(folder, what, param);
  if (!files.some((f) => PEFT_WEIGHT_FILES.includes(f.file))) {
    throw new BadRequestError(`${what}: ${folder} holds adapter_config.json but no ${PEFT_WEIGHT_FILES.join(" or ")}, the adapter's weights vLLM loads.`, {
      code: "adapter_invalid",
      param,
    });
  }
}

/** The weights file names PEFT saves and vLLM reads (safetensors first). */
const PEFT_WEIGHT_FILES = ["adapter_model.safetensors", "adapter_model.bin"];
