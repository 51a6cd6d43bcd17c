// Before each engine attempt: where are this model's weights on this machine, and are
// they usable? The answer is checked again before every attempt, since a mirrored file
// may complete, vanish or be replaced between attempts. A failure here fails the attempt
// without a spawn, with a message that says what to do, and parks the replica like any
// repeated failure.
//
// `assertWeightsUsable` is the one place the agent judges a weights file; the local
// agent's preflight is its only caller. Today it checks that the file exists, is a regular
// file and is readable; a stronger check (a GGUF header the bundled llama.cpp accepts,
// tensor data within the file, a supported architecture) belongs here once the catalog
// has it, so that a catalog row that became invalid shows as parked with the reason.
import { constants } from "node:fs";
import { access, stat } from "node:fs/promises";
import path from "node:path";
import { BadRequestError, describeError, errorCode } from "../core/errors.ts";
import type { CatalogModel } from "../catalog/catalog.ts";
import type { Mirror } from "../mirror/mirror.ts";

/** Where this machine finds a model's GGUF: its file source, or the complete mirrored file. */
export async function locateWeights(model: CatalogModel, mirror: Pick<Mirror, "pathFor"> | undefined): Promise<string> {
  const source = model.definition.source;
  if (source?.kind === "file") return path.resolve(source.path);
  if (source?.kind === "mirror") {
    const found = mirror === undefined ? null : await mirror.pathFor(source.model, source.version, source.file);
    if (found === null) {
      throw new BadRequestError(
        `The weights of model '${model.name}' are not in the mirror yet (${source.model}/${source.version}/${source.file}). Fetch them with 'llmgw ctl mirror fetch' and check 'llmgw ctl mirror list'.`,
        { code: "weights_not_mirrored" },
      );
    }
    return found;
  }
  throw new BadRequestError(`Model '${model.name}' has no weights source; give it a file or mirror source.`, { code: "weights_missing" });
}

/** Throws a BadRequestError naming the file and what to do when the weights at `file` cannot be used to start an engine. */
export async function assertWeightsUsable(file: string, modelName: string): Promise<void> {
  let info;
  try {
    info = await stat(file);
  } catch (error) {
    throw new BadRequestError(`The weights of model '${modelName}' are missing: ${file} (${errorCode(error) ?? describeError(error)}). Put the file back or change the model's source.`, {
      code: "weights_missing",
    });
  }
  if (!info.isFile()) throw new BadRequestError(`The weights of model '${modelName}' at ${file} are not a regular file; point the model's source at a GGUF file.`, { code: "weights_invalid" });
  try {
    await access(file, constants.R_OK);
  } catch {
    throw new BadRequestError(`The weights of model '${modelName}' at ${file} are not readable by this user; fix the file's permissions.`, { code: "weights_unreadable" });
  }
}
