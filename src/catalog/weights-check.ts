// The check of a model's weights, at the door and before every start. A model's source
// must name a file that is there, is a regular file (not a link), is readable, and, for
// llama.cpp, is a GGUF whose header and tensor layout llama.cpp accepts (src/gguf/header.ts),
// of an architecture the bundled llama.cpp loads (src/gguf/llama-support.ts); a mirror
// source must name a complete file of a mirrored version, inside the mirror's folder, held
// by this server (in a cluster, one held only by other servers is refused with the command
// that copies it here).
//
// The catalog runs it before it stores a model (POST and PATCH /api/v1/models, `ctl model
// add`), so what cannot run is refused with a 400 naming the field and what to do. The
// local agent runs `checkWeightsFile` before every engine start, so a file that changed
// after it was accepted (removed, replaced by a truncated copy) fails the start with the
// same reason and parks the model with it, instead of failing inside llama.cpp.
import { constants, type Stats } from "node:fs";
import { access, lstat, readlink, realpath } from "node:fs/promises";
import path from "node:path";
import { BadRequestError, LlmgwError, NotFoundError, describeError, errorCode } from "../core/errors.ts";
import { readGgufHeader, type GgufHeaderSummary } from "../gguf/header.ts";
import { BUNDLED_LLAMA_CPP, checkArchitectureSupport } from "../gguf/llama-support.ts";
import type { ModelDefinition } from "./model-schema.ts";
import { checkAdapters } from "./adapters-check.ts";

/** What the check needs of the mirror: where it keeps files, and whether it vouches for one. */
export interface MirrorLocator {
  readonly root: string;
  /**
   * The absolute path of a complete, verified mirrored file, or why the mirror refuses it
   * (not fetched, failed, modified on disk since it was verified), or, in a cluster, the
   * other servers that hold it when this one does not (`server` is this one's name).
   */
  check(
    model: string,
    version: string,
    file: string,
  ): Promise<
    { kind: "ok"; path: string } | { kind: "refused"; error: Error } | { kind: "elsewhere"; server: string; holders: Array<{ name: string; live: boolean }> }
  >;
}

/** Checks the weights a model definition names; throws a 400 naming the field when they cannot run. */
export interface WeightsChecker {
  check(model: { name: string; definition: ModelDefinition }, signal?: AbortSignal): Promise<void>;
}

export interface CheckWeightsFileOptions {
  /** Absolute path of the weights file on this machine. */
  file: string;
  modelName: string;
  /** The request field the file came from, named by the 400. Default "source.path". */
  param?: string;
  /** Whether llama.cpp loads the file, so it must be a GGUF of a supported architecture. Default true. */
  llamaCpp?: boolean;
  /** Mirrored weights: the mirror's word on the other parts of a split GGUF (see LocatedWeights). */
  vouch?: (file: string) => Promise<void>;
  signal?: AbortSignal;
}

export interface CheckedWeights {
  path: string;
  /** The GGUF header, when the file was checked for llama.cpp. */
  header?: GgufHeaderSummary;
}

/** The weights check on this machine's disk, with the server's mirror for mirror sources. */
export class DiskWeightsChecker implements WeightsChecker {
  constructor(private readonly options: { mirror?: MirrorLocator } = {}) {}

  async check(model: { name: string; definition: ModelDefinition }, signal?: AbortSignal): Promise<void> {
    const { source, profiles } = model.definition;
    // External profiles load nothing here; the schema already requires a source otherwise.
    if (source === undefined || profiles.every((p) => p.engine === "external")) return;
    const mirror = this.options.mirror;
    // Several servers: bytes another running server holds were verified against their sha256
    // there. This server cannot read them; the leader reads their header (copying them first)
    // before it places a replica, checks the adapters against it, and says so in the
    // model's health. What is here is still checked now.
    let header: GgufHeaderSummary | undefined;
    if (!(await heldElsewhere(mirror, source))) {
      const located = await locateWeights({ source, modelName: model.name, ...(mirror ? { mirror } : {}) });
      const checked = await checkWeightsFile({
        ...located,
        modelName: model.name,
        llamaCpp: profiles.some((p) => p.engine === "llamacpp"),
        ...(signal ? { signal } : {}),
      });
      header = checked.header;
    }
    await checkAdapters({ model, header, ...(mirror ? { mirror } : {}), ...(signal ? { signal } : {}) });
    if (source.projector !== undefined && !(await heldElsewhere(mirror, source.kind === "mirror" ? { ...source, file: source.projector } : source))) {
      await checkProjector({ source, modelName: model.name, ...(mirror ? { mirror } : {}), ...(signal ? { signal } : {}) });
    }
  }
}

/** Whether a mirrored file's bytes are only on other servers, one of them running (so the leader copies them). */
export async function heldElsewhere(
  mirror: MirrorLocator | undefined,
  source: { kind: "file" } | { kind: "mirror"; model: string; version: string; file: string },
): Promise<boolean> {
  if (source.kind !== "mirror" || mirror === undefined) return false;
  const checked = await mirror.check(source.model, source.version, source.file);
  return checked.kind === "elsewhere" && checked.holders.some((holder) => holder.live);
}

/**
 * A model's vision projector (source.projector): the same checks as weights (there, a
 * regular readable file, in the mirror when mirrored), and a GGUF whose architecture is
 * `clip`, the one llama.cpp's --mmproj loads; refused at the door with both names otherwise.
 */
export async function checkProjector(options: { source: WeightsSource; modelName: string; mirror?: MirrorLocator; signal?: AbortSignal }): Promise<string> {
  const { source, modelName } = options;
  const projector = source.projector;
  if (projector === undefined) throw new Error("checkProjector: the source names no projector");
  const projectorSource: WeightsSource = source.kind === "file" ? { kind: "file", path: projector } : { ...source, file: projector };
  const located = await locateWeights({ source: projectorSource, modelName, ...(options.mirror ? { mirror: options.mirror } : {}) });
  const param = "source.projector";
  await checkWeightsFile({ file: located.file, modelName, param, llamaCpp: false, ...(options.signal ? { signal: options.signal } : {}) });
  let header: GgufHeaderSummary;
  try {
    header = await readGgufHeader({ file: located.file, ...(options.signal ? { signal: options.signal } : {}) });
  } catch (error) {
    if (options.signal?.aborted === true) throw options.signal.reason ?? error;
    throw new BadRequestError(`The vision projector of model '${modelName}' at ${located.file} is not a GGUF llama.cpp reads: ${describeError(error)}`, {
      code: "projector_invalid",
      param,
      cause: error,
    });
  }
  if (header.architecture !== "clip") {
    throw new BadRequestError(
      `The vision projector of model '${modelName}' at ${located.file} is a '${header.architecture}' GGUF; a projector is a 'clip' GGUF (often named mmproj-*.gguf) that llama-server loads with --mmproj.`,
      { code: "projector_invalid", param },
    );
  }
  return located.file;
}

type WeightsSource = NonNullable<ModelDefinition["source"]>;

export interface LocatedWeights {
  file: string;
  param: string;
  /** For mirrored weights: throws unless the mirror vouches for another file of the same version (a split GGUF's other parts). */
  vouch?: (file: string) => Promise<void>;
}

/** The file a source names on this machine, and the request field to blame for it. */
export async function locateWeights(options: { source: WeightsSource; modelName: string; mirror?: MirrorLocator }): Promise<LocatedWeights> {
  const { source, modelName, mirror } = options;
  if (source.kind === "file") return { file: path.resolve(source.path), param: "source.path" };
  const named = `${source.model}/${source.version}/${source.file}`;
  if (mirror === undefined) {
    throw new BadRequestError(`Model '${modelName}' names mirrored weights (${named}), but this server has no mirror; give a file source instead.`, {
      code: "weights_not_mirrored",
      param: "source",
    });
  }
  const checked = await mirror.check(source.model, source.version, source.file);
  if (checked.kind === "refused") throw notMirrored(modelName, named, source.model, checked.error);
  if (checked.kind === "elsewhere") throw onOtherServer(modelName, named, source, checked);
  const found = checked.path;
  // A link or a bind inside the mirror's folder must not lead a model to a file outside it.
  const [real, root] = await Promise.all([realpath(found).catch(() => found), realpath(mirror.root).catch(() => path.resolve(mirror.root))]);
  if (!real.startsWith(root + path.sep)) {
    throw new BadRequestError(
      `The mirrored file ${named} of model '${modelName}' resolves to ${real}, outside the mirror (${root}); delete that version with 'llmgw ctl mirror rm' and fetch it again.`,
      { code: "weights_outside_mirror", param: "source" },
    );
  }
  // The other parts of a split GGUF must be files the mirror vouches for too.
  const versionDir = found.slice(0, found.length - source.file.length);
  const vouch = async (part: string) => {
    const partFile = path.relative(versionDir, part).split(path.sep).join("/");
    const partChecked = await mirror.check(source.model, source.version, partFile);
    const partNamed = `${source.model}/${source.version}/${partFile}`;
    if (partChecked.kind === "refused") throw notMirrored(modelName, partNamed, source.model, partChecked.error);
    if (partChecked.kind === "elsewhere") throw onOtherServer(modelName, partNamed, source, partChecked);
  };
  return { file: found, param: "source.file", vouch };
}

/** The mirror does not vouch for a file a model needs: why, and what to do in any context (adding the model, or starting it). */
function notMirrored(modelName: string, named: string, mirrorModel: string, why: Error): BadRequestError {
  return new BadRequestError(
    `The weights of model '${modelName}' cannot be used from the mirror (${named}): ${describeError(why)}. ` +
      `Fetch them with 'llmgw ctl mirror fetch' (or, for a file modified on disk, check it with 'llmgw ctl mirror verify'), wait until 'llmgw ctl mirror list --model ${mirrorModel}' shows it complete, then try again.`,
    { code: "weights_not_mirrored", param: "source" },
  );
}

/** The file is mirrored, but its bytes are on other servers of the cluster, not this one: which, and how to copy them here. */
function onOtherServer(
  modelName: string,
  named: string,
  source: { model: string; version: string },
  elsewhere: { server: string; holders: Array<{ name: string; live: boolean }> },
): BadRequestError {
  const holders = elsewhere.holders.map((holder) => `'${holder.name}'${holder.live ? "" : " (not running)"}`).join(", ");
  return new BadRequestError(
    `The weights of model '${modelName}' (${named}) are held in the mirror of server${elsewhere.holders.length === 1 ? "" : "s"} ${holders}, not of this server ('${elsewhere.server}'). ` +
      `Copy them here with 'llmgw ctl mirror replicate ${source.model} ${source.version} --to ${elsewhere.server}' (or --to all), then try again.`,
    { code: "weights_on_other_server", param: "source" },
  );
}

/**
 * Checks one weights file: there, a regular file and not a link, readable, and for
 * llama.cpp a GGUF with its tensor data inside the file, of an architecture the bundled
 * llama.cpp loads. Throws a 400 whose `param` is `options.param`.
 *
 * A link is refused rather than followed: the check and the engine's open are moments
 * apart, and a link can be re-pointed in between (or later, by whoever owns its folder),
 * so the file that was checked would not be the one loaded. The message names the real
 * path to use instead.
 */
export async function checkWeightsFile(options: CheckWeightsFileOptions): Promise<CheckedWeights> {
  const { file, modelName } = options;
  const param = options.param ?? "source.path";
  const refuse = (message: string, code: string, cause?: unknown) => new BadRequestError(message, { code, param, ...(cause === undefined ? {} : { cause }) });
  const weights = `The weights of model '${modelName}'`;

  let info: Stats;
  try {
    info = await lstat(file);
  } catch (error) {
    const code = errorCode(error);
    if (code === "ENOENT" || code === "ENOTDIR")
      throw refuse(`${weights} are missing: ${file} does not exist. Put the file there or change the model's ${param}.`, "weights_missing", error);
    throw refuse(
      `${weights} cannot be reached at ${file} (${code ?? describeError(error)}): the user llmgw runs as needs search permission on every folder above it.`,
      "weights_unreadable",
      error,
    );
  }
  if (info.isSymbolicLink()) {
    const target = await readlink(file).catch(() => "?");
    const real = await realpath(file).catch(() => null);
    const instead = real === null ? "it points nowhere (a dangling link): give the path of the file itself" : `give the file's real path (${real}) instead`;
    throw refuse(
      `${weights} at ${file} are a symbolic link (to ${target}). llmgw does not follow links to weights, since a link can be re-pointed after the check: ${instead}.`,
      "weights_symlink",
    );
  }
  if (!info.isFile()) {
    const what = info.isDirectory() ? "a folder" : "not a regular file";
    throw refuse(`${weights} at ${file} are ${what}; give the path of the weights file itself (for a GGUF model, the .gguf file).`, "weights_not_file");
  }
  try {
    await access(file, constants.R_OK);
  } catch (error) {
    throw refuse(
      `${weights} at ${file} are not readable by the user llmgw runs as; fix the file's permissions (for example chmod a+r) or its owner.`,
      "weights_unreadable",
      error,
    );
  }
  if (options.llamaCpp === false) return { path: file };

  let header: GgufHeaderSummary;
  try {
    header = await readGgufHeader({ file, ...(options.signal ? { signal: options.signal } : {}) });
  } catch (error) {
    if (options.signal?.aborted === true) throw options.signal.reason ?? error;
    // The header check's messages name the file and what to do; they become this field's 400.
    if (error instanceof BadRequestError || error instanceof NotFoundError) throw refuse(`${weights} cannot be loaded: ${error.message}`, error.code, error);
    if (error instanceof LlmgwError) throw error;
    throw refuse(`${weights} at ${file} could not be read: ${describeError(error)}.`, "weights_unreadable", error);
  }
  const support = checkArchitectureSupport({
    architecture: header.architecture,
    engine: { name: "node-llama-cpp", version: BUNDLED_LLAMA_CPP.nodeLlamaCppVersions[0]! },
  });
  if (!support.supported) throw refuse(`${weights} at ${file} are a '${header.architecture}' model. ${support.reason}`, "architecture_unsupported");
  if (header.split !== undefined && header.split.count > 1) await checkSplitParts({ ...options, param }, header.split);
  return { path: file, header };
}

/**
 * A split GGUF (written by gguf-split) is loaded from its first part, and llama.cpp finds
 * the other parts by name beside it: PREFIX-00001-of-0000N.gguf, PREFIX-00002-of-0000N.gguf
 * and so on (llama_split_prefix and llama_split_path in src/llama.cpp of the bundled
 * build); it refuses to start from any other part. Each other part must be there as a
 * regular readable file. Their headers are not read: gguf-split writes the model's keys
 * into the first part only.
 */
async function checkSplitParts(options: CheckWeightsFileOptions & { param: string }, split: { no: number; count: number }): Promise<void> {
  const { file, modelName, param } = options;
  const suffix = (no: number) => `-${String(no + 1).padStart(5, "0")}-of-${String(split.count).padStart(5, "0")}.gguf`;
  const first = suffix(0);
  if (split.no !== 0) {
    throw new BadRequestError(
      `The weights of model '${modelName}' at ${file} are part ${split.no + 1} of a ${split.count}-part split GGUF; llama.cpp loads a split model from its first part, so give the file ending in ${first} instead.`,
      { code: "weights_not_first_part", param },
    );
  }
  if (!file.endsWith(first)) {
    throw new BadRequestError(
      `The weights of model '${modelName}' at ${file} are the first part of a ${split.count}-part split GGUF, but the name does not end in ${first}, so llama.cpp cannot find the other parts; keep the names gguf-split gave the parts.`,
      { code: "weights_split_name", param },
    );
  }
  const prefix = file.slice(0, -first.length);
  for (let no = 1; no < split.count; no += 1) {
    const part = `${prefix}${suffix(no)}`;
    await options.vouch?.(part);
    await checkWeightsFile({ ...options, file: part, llamaCpp: false });
  }
}
