// What the server knows about a model's weights before it places a replica: which files
// a node needs (the source file, then the other parts of a split GGUF) with their sizes
// and verified sha256 from the mirror, a key that names them (so placement can prefer
// nodes that already hold them), and the GGUF header that memory estimates are made from.
// Read once per model definition and cached by the fleet.
import { lstat } from "node:fs/promises";
import path from "node:path";
import { describeError } from "../core/errors.ts";
import type { CatalogModel } from "../catalog/catalog.ts";
import { readGgufHeader, type GgufHeaderSummary } from "../gguf/header.ts";
import type { Mirror } from "../mirror/mirror.ts";
import type { AssignedAdapter, AssignedFile } from "./agent-protocol.ts";
import { FileHashMemo, pinAdapters } from "./adapter-pins.ts";

export interface ModelWeights {
  /** "mirror:MODEL/VERSION" or "file:/abs/path". */
  key: string;
  /** The source file, the other parts of a split GGUF, then the vision projector (source.projector) when there is one. */
  files: AssignedFile[];
  /** Bytes of the vision projector, which llama-server loads beside the weights. */
  projectorBytes?: number;
  /** The model's adapters, pinned (adapter-pins.ts). */
  adapters: AssignedAdapter[];
  bytes: number;
  header?: GgufHeaderSummary;
}

/** The suffix gguf-split gives part `no` (0-based) of `count`: -00001-of-00003.gguf. */
export function splitPartSuffix(no: number, count: number): string {
  return `-${String(no + 1).padStart(5, "0")}-of-${String(count).padStart(5, "0")}.gguf`;
}

/** What the fleet reads of the mirror: a file's check, and (for vLLM folders) the files of a version. */
export type MirrorReader = Pick<Mirror, "check"> & Partial<Pick<Mirror, "list" | "replicate">>;

/** The model's weights as this server sees them; throws with the reason when they are not servable now. */
/** `memo`: the sha256 of adapter files already hashed on this server (adapter-pins.ts). */
export async function readModelWeights(model: CatalogModel, mirror: MirrorReader, memo: FileHashMemo = new FileHashMemo()): Promise<ModelWeights> {
  const adapters = (header: GgufHeaderSummary | undefined) => pinAdapters({ model, mirror, llamaCpp, header, memo });
  const source = model.definition.source;
  if (source === undefined) throw new Error(`model '${model.name}' has no weights source`);
  const llamaCpp = model.definition.profiles.some((p) => p.engine === "llamacpp");
  if (source.kind === "file") {
    const info = await lstat(source.path);
    const header = llamaCpp ? await readGgufHeader({ file: source.path }) : undefined;
    const files: AssignedFile[] = [{ file: source.path, bytes: info.size, sha256: originSha256(model, source.path, info.size) }];
    if (header?.split !== undefined && header.split.count > 1) {
      const prefix = source.path.slice(0, -splitPartSuffix(0, header.split.count).length);
      for (let no = 1; no < header.split.count; no += 1) {
        const part = prefix + splitPartSuffix(no, header.split.count);
        files.push({ file: part, bytes: (await lstat(part)).size, sha256: originSha256(model, part, null) });
      }
    }
    if (source.projector !== undefined) {
      const bytes = (await lstat(source.projector)).size;
      files.push({ file: source.projector, bytes, sha256: originSha256(model, source.projector, bytes) });
    }
    return withTotals(`file:${source.path}`, files, source.projector, header, await adapters(header));
  }
  const checked = await mirror.check(source.model, source.version, source.file);
  if (checked.kind !== "ok") throw checked.error;
  const header = llamaCpp ? await readGgufHeader({ file: checked.path }) : undefined;
  const files: AssignedFile[] = [{ file: source.file, bytes: checked.size, sha256: checked.sha256 }];
  if (!llamaCpp && mirror.list !== undefined) {
    // vLLM loads a folder (config.json, tokenizer, every shard): the node needs the whole mirrored version.
    const others = (await mirror.list({ model: source.model })).filter((f) => f.version === source.version && f.file !== source.file);
    for (const other of others.sort((a, b) => a.file.localeCompare(b.file))) {
      const otherChecked = await mirror.check(source.model, source.version, other.file);
      if (otherChecked.kind !== "ok") throw otherChecked.error;
      files.push({ file: other.file, bytes: otherChecked.size, sha256: otherChecked.sha256 });
    }
  }
  if (header?.split !== undefined && header.split.count > 1) {
    const prefix = source.file.slice(0, -splitPartSuffix(0, header.split.count).length);
    for (let no = 1; no < header.split.count; no += 1) {
      const part = prefix + splitPartSuffix(no, header.split.count);
      const partChecked = await mirror.check(source.model, source.version, part);
      if (partChecked.kind !== "ok") throw partChecked.error;
      files.push({ file: part, bytes: partChecked.size, sha256: partChecked.sha256 });
    }
  }
  if (source.projector !== undefined && llamaCpp) {
    const projectorChecked = await mirror.check(source.model, source.version, source.projector);
    if (projectorChecked.kind !== "ok") throw projectorChecked.error;
    files.push({ file: source.projector, bytes: projectorChecked.size, sha256: projectorChecked.sha256 });
  }
  return withTotals(`mirror:${source.model}/${source.version}`, files, source.projector, header, await adapters(header));
}

function withTotals(
  key: string,
  files: AssignedFile[],
  projector: string | undefined,
  header: GgufHeaderSummary | undefined,
  adapters: AssignedAdapter[],
): ModelWeights {
  const projectorFile = projector === undefined ? undefined : files.find((f) => f.file === projector);
  return {
    key,
    files,
    bytes: files.reduce((sum, f) => sum + (f !== projectorFile ? (f.bytes ?? 0) : 0), 0),
    ...(projectorFile ? { projectorBytes: projectorFile.bytes ?? 0 } : {}),
    ...(header ? { header } : {}),
    adapters,
  };
}

/**
 * The published sha256 of a local file, when the model's origin lists a file of that name
 * and size (a local copy of a repository file); null when nothing was published for it.
 */
function originSha256(model: CatalogModel, file: string, bytes: number | null): string | null {
  const base = path.basename(file);
  const match = model.definition.origin?.files.find((f) => path.basename(f.path) === base && (bytes === null || f.bytes === bytes));
  return match?.sha256 ?? null;
}

/** A short reason for the health line when the weights cannot be read. */
export function weightsProblem(model: CatalogModel, error: unknown): string {
  return `the weights of '${model.name}' cannot be read on the server: ${describeError(error)}`;
}
