// Where a download's bytes come from for a local source (a `file:` URL): the file opened
// from an offset, refused when its size or mtime differ from when it was listed (a local
// version is named after them, so the copy must be of those bytes, not newer ones).
import { createReadStream } from "node:fs";
import { open, stat, type FileHandle } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { ConflictError } from "../core/errors.ts";
import { localReadError } from "../registry/local-source.ts";
import { READ_HIGH_WATER_MARK } from "./content-hash.ts";
import type { Source } from "./http-source.ts";
import { MirrorTransientError } from "./mirror-errors.ts";
import type { MirrorFetchFile } from "./mirror-types.ts";

export function isLocalUrl(url: string): boolean {
  return url.startsWith("file:");
}

/** Size and mtime of a local source file now; a failure to look is an llmgw error naming the file. */
export async function statLocalSource(spec: MirrorFetchFile, handle?: FileHandle): Promise<{ size: number; mtimeMs: number }> {
  const file = fileURLToPath(spec.url);
  try {
    const info = handle === undefined ? await stat(file) : await handle.stat();
    return { size: info.size, mtimeMs: info.mtimeMs };
  } catch (error) {
    throw localReadError(error, file);
  }
}

/** How a local source differs from what it was listed as, or null when it does not. */
export function localSourceChange(spec: MirrorFetchFile, now: { size: number; mtimeMs: number }): string | null {
  if (spec.size !== null && now.size !== spec.size) return `it is ${now.size} bytes, it was listed with ${spec.size}`;
  if (spec.sourceMtimeMs !== undefined && spec.sourceMtimeMs !== null && now.mtimeMs !== spec.sourceMtimeMs) {
    return `it was modified at ${new Date(now.mtimeMs).toISOString()}, after it was listed (${new Date(spec.sourceMtimeMs).toISOString()})`;
  }
  return null;
}

export function localSourceChangedError(spec: MirrorFetchFile, problem: string, when: string): ConflictError {
  return new ConflictError(
    `The local source file '${fileURLToPath(spec.url)}' of '${spec.path}' changed ${when} (${problem}). ` +
      `A local version is named after its files' sizes and modification times, so fetch again: the files are listed anew and copied as a new version.`,
    { code: "mirror_local_source_changed" },
  );
}

export async function openLocalSource(spec: MirrorFetchFile, offset: number, signal: AbortSignal): Promise<Source> {
  const file = fileURLToPath(spec.url);
  // Opened before anything else, so a file this process may not read is a clear failure
  // naming it, not a stream error classified as a flaky source and retried.
  let handle: FileHandle;
  try {
    handle = await open(file, "r");
  } catch (error) {
    throw localReadError(error, file);
  }
  try {
    const now = await statLocalSource(spec, handle);
    const problem = localSourceChange(spec, now);
    if (problem !== null) throw localSourceChangedError(spec, problem, "since it was listed");
    if (offset === now.size) {
      await handle.close();
      return { start: offset, total: now.size, body: null, url: spec.url };
    }
    if (offset > now.size) {
      throw new MirrorTransientError(`The local source '${file}' is shorter (${now.size} bytes) than the partial copy (${offset}); starting over.`, {
        code: "mirror_bad_range",
        restartFromZero: true,
      });
    }
    // The stream owns the handle from here and closes it when it ends or is destroyed.
    const body = createReadStream(file, { fd: handle, start: offset, highWaterMark: READ_HIGH_WATER_MARK, signal });
    return { start: offset, total: now.size, body, url: spec.url };
  } catch (error) {
    await handle.close().catch(() => undefined);
    throw error;
  }
}
