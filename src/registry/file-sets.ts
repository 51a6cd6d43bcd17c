// File sets: what a repository's file list means to an engine. A GGUF repository holds
// one loadable artifact per quantisation (a single file, or a split `-0000N-of-0000M`
// series that llama.cpp opens from its first part), maybe vision projectors (`mmproj`) and
// importance matrices (inputs to quantising, never served). A safetensors repository holds
// shards with their index plus the companions vLLM reads next to them (config, tokenizer,
// chat template). These are pure functions over a file list, so the serve job, the CLI and
// tests all classify the same way. Naming facts: reference/protocols.md, "Shard naming".
import { BadRequestError, NotFoundError } from "../core/errors.ts";
import { formatBytes } from "../core/format.ts";
import { sanitizeRepoPath } from "./repo-path.ts";

/** The least a file needs for classification; RepoFile satisfies it. */
export interface ListedFile {
  path: string;
  size: number;
}

export type ArtifactFormat = "gguf" | "safetensors";

export interface ArtifactSet<F extends ListedFile = ListedFile> {
  format: ArtifactFormat;
  /** How the set is named in listings and errors: the quantisation label for GGUF, the file prefix for safetensors, after its folder. */
  name: string;
  /** GGUF quantisation label, upper case (`Q4_K_M`, `UD-Q4_K_XL`, `F16`); null when the name has none, and for safetensors. */
  quant: string | null;
  /** Folder inside the repository ("" for the root). */
  dir: string;
  /** The file an engine is given: the GGUF (first part of a split), or the safetensors index (else the single file). */
  entry: string;
  /** The files of the set in load order: split parts by number; the safetensors index first, then its shards. */
  files: F[];
  totalBytes: number;
  /** For split GGUF and sharded safetensors: how many parts the names announce, and the numbers of those not in the repository. */
  split: { count: number; missing: number[] } | null;
  /** False when parts are missing (or a safetensors index has no shards next to it). */
  complete: boolean;
}

export interface Projector<F extends ListedFile = ListedFile> {
  file: F;
  quant: string | null;
  dir: string;
}

export interface FileSets<F extends ListedFile = ListedFile> {
  gguf: ArtifactSet<F>[];
  safetensors: ArtifactSet<F>[];
  /** Vision projectors (`mmproj*.gguf`): kept apart from the weights and offered with them. */
  projectors: Projector<F>[];
  /** Files an engine reads beside safetensors weights: config, tokenizer, generation config, chat template, processor config. */
  companions: F[];
  /** Files left out on purpose, with the reason (importance matrices). */
  excluded: { file: F; reason: string }[];
  /** Everything else (README, images, .gitattributes, PyTorch .bin …): not used. */
  other: F[];
}

export const DEFAULT_QUANT = "Q4_K_M";

const COMPANION_NAMES = new Set([
  "config.json",
  "generation_config.json",
  "tokenizer.json",
  "tokenizer_config.json",
  "tokenizer.model",
  "special_tokens_map.json",
  "added_tokens.json",
  "vocab.json",
  "vocab.txt",
  "merges.txt",
  "spiece.model",
  "sentencepiece.bpe.model",
  "chat_template.json",
  "chat_template.jinja",
  "preprocessor_config.json",
  "processor_config.json",
  "video_preprocessor_config.json",
  // Mistral's own format, read by vLLM with --tokenizer-mode mistral.
  "params.json",
  "tekken.json",
]);

// llama.cpp writes splits as "%s-%05d-of-%05d.gguf" (1-based); the GGUF spec requires 5 digits.
const GGUF_SPLIT = /^(?<prefix>.*?)-(?<shard>\d{5})-of-(?<total>\d{5})\.gguf$/i;
// huggingface_hub writes shards as "{prefix}-00001-of-00004.safetensors"; this is huggingface.js's regex.
const SAFETENSORS_SHARD = /^(?<prefix>(?<basePrefix>.*?)[_-])(?<shard>\d{5,6})-of-(?<total>\d{5,6})\.safetensors$/;
const SAFETENSORS_INDEX = /^(?<basePrefix>.+)\.safetensors\.index\.json$/;
// A quantisation label as llama.cpp and the usual uploaders write it in file names: the
// k-quants and i-quants (Q4_K_M, IQ4_XS, Q4_0_4_4), ternary TQ1_0, float types, MXFP4,
// and Unsloth's "UD-" dynamic variants. It must stand alone between separators.
const QUANT_LABEL = /(?<![A-Za-z0-9])(?:UD-)?(?:I?Q[1-8](?:_[A-Za-z0-9]{1,4})+|TQ[12]_[0-9]|BF16|F16|F32|F64|FP16|FP32|MXFP4(?:_MOE)?)(?![A-Za-z0-9])/gi;

/** Upper case, with `FP16`/`FP32` spelled the way llama.cpp names them (`F16`/`F32`). */
export function normaliseQuant(label: string): string {
  const upper = label.trim().toUpperCase();
  return upper.replace(/(^|-)FP(16|32)$/, "$1F$2");
}

/**
 * The quantisation label in a GGUF path: the last label-shaped token of the file name
 * (after removing a split suffix), else of the folders above it. Null when there is none.
 */
export function ggufQuantLabel(path: string): string | null {
  const segments = path.split("/");
  const base = (segments.pop() ?? "").replace(/(-\d{5}-of-\d{5})?\.gguf$/i, "");
  for (const candidate of [base, ...segments.reverse()]) {
    const matches = [...candidate.matchAll(QUANT_LABEL)];
    const last = matches[matches.length - 1];
    if (last !== undefined) return normaliseQuant(last[0]);
  }
  return null;
}

/** Sorts a repository's files into artifact sets. Throws a 400 naming any path that is not a safe relative path. */
export function classifyFiles<F extends ListedFile>(files: readonly F[]): FileSets<F> {
  const result: FileSets<F> = { gguf: [], safetensors: [], projectors: [], companions: [], excluded: [], other: [] };
  const ggufSplits = new Map<string, { prefix: string; total: number; parts: Map<number, F> }>();
  const stShards = new Map<string, { dir: string; basePrefix: string; total: number; parts: Map<number, F> }>();
  const stSingles: F[] = [];
  const stIndexes: { dir: string; basePrefix: string; file: F }[] = [];

  for (const file of files) {
    sanitizeRepoPath(file.path, "files");
    const { dir, base } = splitPath(file.path);
    const lower = base.toLowerCase();
    if (lower.includes("imatrix")) {
      result.excluded.push({ file, reason: "importance matrix: an input to quantisation, not weights" });
      continue;
    }
    if (lower.endsWith(".gguf")) {
      if (lower.includes("mmproj")) {
        result.projectors.push({ file, quant: ggufQuantLabel(file.path), dir });
        continue;
      }
      const split = GGUF_SPLIT.exec(file.path);
      if (split?.groups !== undefined) {
        const prefix = split.groups.prefix ?? "";
        const total = Number(split.groups.total);
        const key = `${prefix}\u0000${total}`;
        const group = ggufSplits.get(key) ?? { prefix, total, parts: new Map<number, F>() };
        group.parts.set(Number(split.groups.shard), file);
        ggufSplits.set(key, group);
        continue;
      }
      result.gguf.push(
        makeSet({ format: "gguf", name: labelOrName(file.path), quant: ggufQuantLabel(file.path), dir, entry: file.path, files: [file], split: null }),
      );
      continue;
    }
    if (lower.endsWith(".safetensors")) {
      const shard = SAFETENSORS_SHARD.exec(base);
      if (shard?.groups !== undefined) {
        const basePrefix = shard.groups.basePrefix ?? "";
        const total = Number(shard.groups.total);
        const key = `${dir}\u0000${basePrefix}\u0000${total}`;
        const group = stShards.get(key) ?? { dir, basePrefix, total, parts: new Map<number, F>() };
        group.parts.set(Number(shard.groups.shard), file);
        stShards.set(key, group);
      } else {
        stSingles.push(file);
      }
      continue;
    }
    const index = SAFETENSORS_INDEX.exec(base);
    if (index?.groups !== undefined) {
      stIndexes.push({ dir, basePrefix: index.groups.basePrefix ?? "", file });
      continue;
    }
    if (isCompanion(base)) {
      result.companions.push(file);
      continue;
    }
    result.other.push(file);
  }

  for (const group of ggufSplits.values()) {
    const { parts, missing, complete } = orderParts(group.parts, group.total);
    const first = parts[0]?.path ?? `${group.prefix}-00001-of-${String(group.total).padStart(5, "0")}.gguf`;
    result.gguf.push(
      makeSet({
        format: "gguf",
        name: labelOrName(first),
        quant: ggufQuantLabel(first),
        dir: splitPath(first).dir,
        entry: `${group.prefix}-00001-of-${String(group.total).padStart(5, "0")}.gguf`,
        files: parts,
        split: { count: group.total, missing },
        complete,
      }),
    );
  }

  const usedIndexes = new Set<F>();
  const indexFor = (dir: string, basePrefix: string): F | undefined => {
    const found = stIndexes.find((index) => index.dir === dir && index.basePrefix === basePrefix && !usedIndexes.has(index.file));
    if (found !== undefined) usedIndexes.add(found.file);
    return found?.file;
  };
  for (const group of stShards.values()) {
    const { parts, missing, complete } = orderParts(group.parts, group.total);
    const index = indexFor(group.dir, group.basePrefix);
    result.safetensors.push(
      makeSet({
        format: "safetensors",
        name: joinPath(group.dir, group.basePrefix),
        quant: null,
        dir: group.dir,
        entry: index?.path ?? parts[0]?.path ?? "",
        files: index === undefined ? parts : [index, ...parts],
        split: { count: group.total, missing },
        // Without its index, transformers and vLLM cannot map tensors to shards.
        complete: complete && index !== undefined,
      }),
    );
  }
  for (const file of stSingles) {
    const { dir, base } = splitPath(file.path);
    const basePrefix = base.replace(/\.safetensors$/i, "");
    const index = indexFor(dir, basePrefix);
    result.safetensors.push(
      makeSet({
        format: "safetensors",
        name: joinPath(dir, basePrefix),
        quant: null,
        dir,
        entry: index?.path ?? file.path,
        files: index === undefined ? [file] : [index, file],
        split: null,
      }),
    );
  }
  for (const index of stIndexes) {
    if (usedIndexes.has(index.file)) continue;
    // An index whose shards do not follow the standard names: offered, but not complete.
    result.safetensors.push(
      makeSet({
        format: "safetensors",
        name: joinPath(index.dir, index.basePrefix),
        quant: null,
        dir: index.dir,
        entry: index.file.path,
        files: [index.file],
        split: null,
        complete: false,
      }),
    );
  }

  result.gguf.sort(bySetPath);
  result.safetensors.sort(bySetPath);
  result.projectors.sort((a, b) => compare(a.file.path, b.file.path));
  return result;
}

export interface ChooseArtifactOptions<F extends ListedFile> {
  sets: FileSets<F>;
  /** A quantisation label, case-insensitive (`q4_k_m`, `IQ4_XS`, `UD-Q4_K_XL`). Default Q4_K_M for GGUF. */
  quant?: string | undefined;
  /** An exact file of the repository (path, or file name when only one file has it); any part of a split picks the whole split. */
  file?: string | undefined;
  /** Default: from `file` when given, else GGUF when the repository has any, else safetensors. */
  format?: ArtifactFormat | undefined;
  /** A vision projector: true for the best one on offer (F16 first), or its path, file name or label. */
  projector?: boolean | string | undefined;
}

export interface ChosenArtifact<F extends ListedFile> {
  set: ArtifactSet<F>;
  /** For safetensors: the companions in the set's folder. GGUF carries its tokenizer and template inside. */
  companions: F[];
  projector: F | null;
  /** Everything to fetch: the set's files, then companions, then the projector. */
  files: F[];
  totalBytes: number;
  /** Projectors the repository has, for the report even when none was asked for. */
  projectorsOffered: F[];
}

/**
 * Picks what to serve: a GGUF set by quantisation (Q4_K_M unless told otherwise; a
 * repository with exactly one complete GGUF set gives that one), a set by one of its
 * files, or the safetensors set. Not found is a 404 that lists what the repository has.
 */
export function chooseArtifact<F extends ListedFile>(options: ChooseArtifactOptions<F>): ChosenArtifact<F> {
  const { sets } = options;
  const quant = options.quant === undefined || options.quant.trim() === "" ? undefined : normaliseQuant(options.quant);
  const file = options.file === undefined || options.file === "" ? undefined : sanitizeRepoPath(options.file, "file");
  if (quant !== undefined && file !== undefined) {
    throw new BadRequestError(`Give either a quantisation ('${quant}') or a file ('${file}'), not both.`, { code: "conflicting_options", param: "file" });
  }
  if (quant !== undefined && options.format === "safetensors") {
    throw new BadRequestError(`A quantisation ('${quant}') applies to GGUF files; safetensors are served as they are. Leave out quant, or use format gguf.`, {
      code: "conflicting_options",
      param: "quant",
    });
  }

  let set: ArtifactSet<F>;
  if (file !== undefined) {
    set = setByFile(sets, file, options.format);
  } else {
    const format = options.format ?? (quant !== undefined || sets.gguf.length > 0 ? "gguf" : "safetensors");
    set = format === "gguf" ? ggufByQuant(sets, quant) : defaultSafetensors(sets);
  }
  if (!set.complete) throw incompleteError(set);

  const companions = set.format === "safetensors" ? sets.companions.filter((companion) => splitPath(companion.path).dir === set.dir) : [];
  const projector = pickProjector(sets, set, options.projector);
  const files = [...set.files, ...companions, ...(projector === null ? [] : [projector])];
  return {
    set,
    companions,
    projector,
    files,
    totalBytes: sum(files),
    projectorsOffered: sets.projectors.map((p) => p.file),
  };
}

/** One line per set, for listings and error messages: `Q4_K_M (1 file, 4.6 GiB)`. */
export function describeSet(set: ArtifactSet): string {
  const count = set.split === null ? `${set.files.length} file${set.files.length === 1 ? "" : "s"}` : `${set.split.count} parts`;
  const missing =
    set.split !== null && set.split.missing.length > 0
      ? `, incomplete: part${set.split.missing.length === 1 ? "" : "s"} ${set.split.missing.join(", ")} missing`
      : "";
  const noIndex = set.format === "safetensors" && !set.complete && missing === "" ? ", incomplete" : "";
  return `${set.name} (${count}, ${formatBytes(set.totalBytes)}${missing}${noIndex})`;
}

function ggufByQuant<F extends ListedFile>(sets: FileSets<F>, quant: string | undefined): ArtifactSet<F> {
  if (sets.gguf.length === 0) {
    const has = sets.safetensors.length > 0 ? ` It has safetensors: ${sets.safetensors.map(describeSet).join("; ")}; use format safetensors.` : "";
    throw new NotFoundError(`This repository has no GGUF files.${has}`, { code: "no_gguf_files", param: "quant" });
  }
  const wanted = quant ?? DEFAULT_QUANT;
  const matching = sets.gguf.filter((set) => set.quant === wanted);
  if (matching.length === 1 && matching[0] !== undefined) return matching[0];
  if (matching.length > 1) {
    throw new BadRequestError(`More than one GGUF set in this repository is ${wanted}: ${matching.map((set) => set.entry).join(", ")}. Pick one with file.`, {
      code: "ambiguous_quant",
      param: "quant",
    });
  }
  if (quant === undefined) {
    const complete = sets.gguf.filter((set) => set.complete);
    if (complete.length === 1 && complete[0] !== undefined) return complete[0];
  }
  throw new NotFoundError(
    `This repository has no ${wanted} GGUF${quant === undefined ? " (the default)" : ""}. It has: ${sets.gguf.map(describeSet).join("; ")}. Pick one with quant, or an exact file with file.`,
    { code: "quant_not_found", param: "quant" },
  );
}

function defaultSafetensors<F extends ListedFile>(sets: FileSets<F>): ArtifactSet<F> {
  const candidates = sets.safetensors;
  if (candidates.length === 0) {
    const has = sets.gguf.length > 0 ? ` It has GGUF: ${sets.gguf.map(describeSet).join("; ")}; use format gguf.` : "";
    throw new NotFoundError(`This repository has no safetensors weights.${has}`, { code: "no_safetensors_files", param: "format" });
  }
  // The transformers layout is `model.safetensors` or `model-0000N-of-0000M.safetensors` at the root.
  const root = candidates.filter((set) => set.dir === "");
  const standard = root.find((set) => set.name === "model");
  if (standard !== undefined) return standard;
  const completeRoot = root.filter((set) => set.complete);
  if (completeRoot.length === 1 && completeRoot[0] !== undefined) return completeRoot[0];
  if (candidates.length === 1 && candidates[0] !== undefined) return candidates[0];
  throw new BadRequestError(`This repository has several safetensors sets: ${candidates.map(describeSet).join("; ")}. Pick one with file.`, {
    code: "ambiguous_safetensors",
    param: "file",
  });
}

function setByFile<F extends ListedFile>(sets: FileSets<F>, file: string, format: ArtifactFormat | undefined): ArtifactSet<F> {
  const all = [...sets.gguf, ...sets.safetensors];
  const exact = all.filter((set) => set.files.some((f) => f.path === file) || set.entry === file);
  const byName = exact.length > 0 ? exact : all.filter((set) => set.files.some((f) => splitPath(f.path).base === file));
  if (byName.length > 1) {
    throw new BadRequestError(`More than one file in this repository is named '${file}': ${byName.map((set) => set.entry).join(", ")}. Give the full path.`, {
      code: "ambiguous_file",
      param: "file",
    });
  }
  const found = byName[0];
  if (found !== undefined) {
    if (format !== undefined && found.format !== format) {
      throw new BadRequestError(`'${file}' is a ${found.format} file, but format ${format} was asked for.`, { code: "conflicting_options", param: "format" });
    }
    return found;
  }
  const matches = (path: string): boolean => path === file || splitPath(path).base === file;
  if (sets.projectors.some((p) => matches(p.file.path))) {
    throw new BadRequestError(`'${file}' is a vision projector, not model weights: pass it as projector, with a GGUF quant or file for the weights.`, {
      code: "file_is_projector",
      param: "file",
    });
  }
  if (sets.excluded.some((e) => matches(e.file.path))) {
    throw new BadRequestError(`'${file}' is an importance matrix (an input to quantisation), not model weights; pick a GGUF file.`, {
      code: "file_excluded",
      param: "file",
    });
  }
  const weights = all.flatMap((set) => set.files.map((f) => f.path)).filter((path) => !path.endsWith(".json"));
  throw new NotFoundError(`This repository has no file '${file}'. Its weight files are: ${listNames(weights)}.`, { code: "file_not_found", param: "file" });
}

function pickProjector<F extends ListedFile>(sets: FileSets<F>, set: ArtifactSet<F>, wanted: boolean | string | undefined): F | null {
  if (wanted === undefined || wanted === false || wanted === "") return null;
  if (set.format !== "gguf") {
    throw new BadRequestError("A separate vision projector goes with GGUF weights; safetensors models carry their vision tower inside.", {
      code: "conflicting_options",
      param: "projector",
    });
  }
  const offered = sets.projectors;
  const offeredText = offered.length === 0 ? "it has none" : `it has: ${offered.map((p) => p.file.path).join(", ")}`;
  if (wanted === true) {
    const near = offered.filter((p) => p.dir === set.dir);
    const pool = near.length > 0 ? near : offered;
    const preference = ["F16", "BF16", "F32", "Q8_0"];
    const ranked = [...pool].sort((a, b) => rank(preference, a.quant) - rank(preference, b.quant) || compare(a.file.path, b.file.path));
    const best = ranked[0];
    if (best === undefined)
      throw new NotFoundError("A vision projector was asked for, but this repository has no mmproj file.", { code: "projector_not_found", param: "projector" });
    return best.file;
  }
  const text = sanitizeRepoPath(wanted, "projector");
  const label = normaliseQuant(text);
  const found =
    offered.find((p) => p.file.path === text) ?? offered.find((p) => splitPath(p.file.path).base === text) ?? offered.find((p) => p.quant === label);
  if (found === undefined)
    throw new NotFoundError(`This repository has no vision projector '${text}'; ${offeredText}.`, { code: "projector_not_found", param: "projector" });
  return found.file;
}

function incompleteError(set: ArtifactSet): NotFoundError {
  if (set.split !== null && set.split.missing.length > 0) {
    return new NotFoundError(
      `The ${set.format} set ${set.name} is incomplete: part${set.split.missing.length === 1 ? "" : "s"} ${set.split.missing.join(", ")} of ${set.split.count} ${set.split.missing.length === 1 ? "is" : "are"} not in the repository. Pick another set.`,
      { code: "incomplete_set", param: "file" },
    );
  }
  return new NotFoundError(
    `The safetensors set ${set.name} is incomplete: it needs both its index (${set.name}.safetensors.index.json) and standard-named shards. Pick another set.`,
    {
      code: "incomplete_set",
      param: "file",
    },
  );
}

function makeSet<F extends ListedFile>(fields: Omit<ArtifactSet<F>, "totalBytes" | "complete"> & { complete?: boolean }): ArtifactSet<F> {
  return { ...fields, totalBytes: sum(fields.files), complete: fields.complete ?? true };
}

function orderParts<F extends ListedFile>(parts: Map<number, F>, total: number): { parts: F[]; missing: number[]; complete: boolean } {
  const missing: number[] = [];
  for (let n = 1; n <= total; n += 1) if (!parts.has(n)) missing.push(n);
  // A part numbered 0 or above the total means the names disagree with each other.
  const stray = [...parts.keys()].some((n) => n < 1 || n > total);
  const ordered = [...parts.entries()].sort((a, b) => a[0] - b[0]).map(([, file]) => file);
  return { parts: ordered, missing, complete: missing.length === 0 && !stray && total > 0 };
}

function isCompanion(base: string): boolean {
  return COMPANION_NAMES.has(base) || base.endsWith(".tiktoken");
}

/** A GGUF set's name: its label, or for a file without one, its path without the extension. */
function labelOrName(path: string): string {
  return ggufQuantLabel(path) ?? path.replace(/(-\d{5}-of-\d{5})?\.gguf$/i, "");
}

function splitPath(path: string): { dir: string; base: string } {
  const slash = path.lastIndexOf("/");
  return slash < 0 ? { dir: "", base: path } : { dir: path.slice(0, slash), base: path.slice(slash + 1) };
}

function joinPath(dir: string, name: string): string {
  return dir === "" ? name : `${dir}/${name}`;
}

function bySetPath(a: ArtifactSet, b: ArtifactSet): number {
  return compare(a.entry, b.entry);
}

function compare(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

function rank(order: string[], value: string | null): number {
  const index = value === null ? -1 : order.indexOf(value);
  return index < 0 ? order.length : index;
}

function sum(files: readonly ListedFile[]): number {
  return files.reduce((total, file) => total + file.size, 0);
}

function listNames(names: string[]): string {
  if (names.length === 0) return "none";
  const shown = names.slice(0, 40).join(", ");
  return names.length > 40 ? `${shown} and ${names.length - 40} more` : shown;
}
