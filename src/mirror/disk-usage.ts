// How much of the disk the mirror takes: bytes per version folder (partial downloads
// counted apart, and whether the store knows the version), and the space left.
import path from "node:path";
import { PARTIAL_SUFFIX } from "./mirror-paths.ts";
import type { MirrorDiskUsage, MirrorIo } from "./mirror-types.ts";
import { fileSize, listDir } from "./disk-files.ts";

/** Bytes, partial bytes and complete-named files below `dir`. */
export async function folderUsage(dir: string): Promise<{ bytes: number; partialBytes: number; files: number }> {
  const usage = { bytes: 0, partialBytes: 0, files: 0 };
  const pending = [dir];
  while (pending.length > 0) {
    const current = pending.pop() as string;
    for (const entry of await listDir(current)) {
      const absolute = path.join(current, entry.name);
      if (entry.isDirectory()) {
        pending.push(absolute);
        continue;
      }
      if (!entry.isFile()) continue;
      const size = (await fileSize(absolute)) ?? 0;
      usage.bytes += size;
      if (entry.name.endsWith(PARTIAL_SUFFIX)) usage.partialBytes += size;
      else usage.files += 1;
    }
  }
  return usage;
}

/** Walks root/{model}/{version}; `isTracked` says whether the store has rows for a version. */
export async function measureDiskUsage(options: {
  root: string;
  io: MirrorIo;
  isTracked: (model: string, version: string) => boolean;
}): Promise<MirrorDiskUsage> {
  const { root } = options;
  const versions: MirrorDiskUsage["versions"] = [];
  for (const model of await listDir(root)) {
    if (!model.isDirectory()) continue;
    for (const version of await listDir(path.join(root, model.name))) {
      if (!version.isDirectory()) continue;
      const usage = await folderUsage(path.join(root, model.name, version.name));
      versions.push({ model: model.name, version: version.name, ...usage, tracked: options.isTracked(model.name, version.name) });
    }
  }
  versions.sort((a, b) => compare(a.model, b.model) || compare(a.version, b.version));
  return {
    root,
    bytes: versions.reduce((sum, v) => sum + v.bytes, 0),
    partialBytes: versions.reduce((sum, v) => sum + v.partialBytes, 0),
    freeBytes: await options.io.freeBytes(root),
    versions,
  };
}

function compare(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}
