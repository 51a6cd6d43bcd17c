// Pins a model's LoRA adapters for its replicas (DESIGN.md "Adapters"): the size and sha256
// a node must find before every engine start, as for weights. A mirrored adapter is pinned by
// the mirror's verified row; a GGUF file adapter by hashing it here; a vLLM PEFT folder by
// hashing each of its files (peft-folder.ts), with the LoRA rank vLLM must be told.
//
// The fleet reads a model's weights once per definition, but again on every pass while they
// are a problem, and a PEFT folder can hold gigabytes: a file is hashed again only when its
// stamp (device, inode, size, mtime, ctime) changed since it was last hashed here.
import type { BigIntStats } from "node:fs";
import { lstat } from "node:fs/promises";
import path from "node:path";
import { adapterServedName } from "../catalog/model-schema.ts";
import { allowsLoraBias, listPeftFolder, readPeftConfig } from "../catalog/peft-folder.ts";
import { describeError } from "../core/errors.ts";
import type { CatalogModel } from "../catalog/catalog.ts";
import { checkAdapterFitsModel, readLoraAdapter } from "../gguf/lora-adapter.ts";
import type { GgufHeaderSummary } from "../gguf/header.ts";
import { ContentHasher, hashFileInto } from "../mirror/content-hash.ts";
import type { AssignedAdapter } from "./agent-protocol.ts";
import type { MirrorReader } from "./model-weights.ts";

/** Most files remembered; a fleet pins a few adapters per model. */
const MEMO_LIMIT = 4096;

/** sha256 of files on this server's disk, remembered by stamp. */
export class FileHashMemo {
  readonly #memo = new Map<string, { stamp: string; bytes: number; sha256: string }>();
  /** Files hashed (not answered from the memo); tests read it. */
  hashed = 0;

  async hash(file: string): Promise<{ bytes: number; sha256: string }> {
    const before = await lstat(file, { bigint: true });
    // A link is not followed (as for weights): its stamp would be the link's, not its target's.
    if (!before.isFile()) throw new Error(`${file} is not a regular file (a link, a folder or a device); give the file itself.`);
    const stamp = stampOf(before);
    const known = this.#memo.get(file);
    if (known !== undefined && known.stamp === stamp) return { bytes: known.bytes, sha256: known.sha256 };
    const hasher = new ContentHasher(null);
    const bytes = await hashFileInto(file, hasher);
    this.hashed += 1;
    const sha256 = hasher.digest().sha256;
    // The stamp after hashing must be the one before: the hash of a file written meanwhile
    // may match no version of it, and a node would refuse every copy. The fleet's next pass reads it again.
    if (stampOf(await lstat(file, { bigint: true })) !== stamp)
      throw new Error(`${file} changed while it was being hashed; it is read again at the next pass.`);
    if (this.#memo.size >= MEMO_LIMIT) this.#memo.delete(this.#memo.keys().next().value!);
    this.#memo.set(file, { stamp, bytes, sha256 });
    return { bytes, sha256 };
  }
}

function stampOf(info: BigIntStats): string {
  return `${info.dev}:${info.ino}:${info.size}:${info.mtimeNs}:${info.ctimeNs}`;
}

/**
 * The model's adapters with what a node must find. A llama.cpp adapter is also checked
 * against the model's header when there is one: a definition added through another server
 * (which could not read the weights) gets the door check's refusal here, in the model's
 * health, instead of llama.cpp's "wrong base model" on every node.
 */
export async function pinAdapters(options: {
  model: CatalogModel;
  mirror: MirrorReader;
  llamaCpp: boolean;
  header: GgufHeaderSummary | undefined;
  memo: FileHashMemo;
}): Promise<AssignedAdapter[]> {
  const { model, mirror, llamaCpp, header } = options;
  const pinned: AssignedAdapter[] = [];
  for (const adapter of model.definition.adapters) {
    const { name, scale, source } = adapter;
    const servedName = adapterServedName(model.name, adapter);
    const what = `Adapter '${name}' of model '${model.name}'`;
    if (source.kind === "mirror") {
      const checked = await mirror.check(source.model, source.version, source.file);
      if (checked.kind !== "ok") throw checked.error;
      if (llamaCpp) {
        await checkFits(checked.path, header, model.name).catch((error: unknown) => {
          throw naming(what, error);
        });
      }
      pinned.push({ name, servedName, scale, source, bytes: checked.size, sha256: checked.sha256 });
    } else {
      // Named in the model's health: which adapter, and why.
      const pinning = pinFileAdapter({ ...options, adapter: { name, servedName, scale, source }, what });
      pinned.push(
        await pinning.catch((error: unknown) => {
          throw naming(what, error);
        }),
      );
    }
  }
  return pinned;
}

/** A file adapter: a GGUF file for llama.cpp (checked against the model's header), or a vLLM PEFT folder, each file pinned. */
async function pinFileAdapter(options: {
  model: CatalogModel;
  llamaCpp: boolean;
  header: GgufHeaderSummary | undefined;
  memo: FileHashMemo;
  adapter: Omit<AssignedAdapter, "bytes" | "sha256"> & { source: { kind: "file"; path: string } };
  what: string;
}): Promise<AssignedAdapter> {
  const { model, memo, adapter, what } = options;
  // A GGUF file for llama.cpp, a folder for vLLM.
  const at = adapter.source.path;
  if (options.llamaCpp) {
    await checkFits(at, options.header, model.name);
    return { ...adapter, ...(await memo.hash(at)) };
  }
  const rank = (await readPeftConfig(at, what, undefined, { allowBias: allowsLoraBias(model.definition.profiles) })).rank;
  const files: NonNullable<AssignedAdapter["files"]> = [];
  for (const entry of await listPeftFolder(at, what)) files.push({ file: entry.file, ...(await memo.hash(path.join(at, entry.file))) });
  return { ...adapter, bytes: files.reduce((sum, f) => sum + f.bytes, 0), sha256: null, files, rank };
}

/** The error, saying which adapter it is about when it does not already. */
function naming(what: string, error: unknown): unknown {
  const text = describeError(error);
  return text.startsWith(what) ? error : new Error(`${what} cannot be used: ${text}`, { cause: error });
}

async function checkFits(file: string, header: GgufHeaderSummary | undefined, modelName: string): Promise<void> {
  if (header === undefined) return;
  const misfit = checkAdapterFitsModel(await readLoraAdapter({ file }), { ...header, source: modelName });
  if (misfit !== null) throw new Error(`${misfit} Give an adapter trained on this model's base.`);
}
