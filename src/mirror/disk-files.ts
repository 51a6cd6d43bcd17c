// The mirror's small file-system operations: sizes and stats (the cheap check that a
// complete file is still what was verified), fsync of files and folders (durability
// before a file is called complete), free space, and the default writer.
import { createWriteStream } from "node:fs";
import { open, readdir, stat, statfs } from "node:fs/promises";
import type { Dirent } from "node:fs";
import type { MirrorIo } from "./mirror-types.ts";

export const defaultIo: MirrorIo = {
  createWriteStream: (file, options) => createWriteStream(file, options),
  freeBytes: async (dir) => {
    try {
      const info = await statfs(dir);
      return info.bavail * info.bsize;
    } catch {
      return null;
    }
  },
};

/** Size of a regular file (or, with `anyKind`, of anything) at `file`, or null when there is none. */
export async function fileSize(file: string, anyKind = false): Promise<number | null> {
  try {
    const info = await stat(file);
    return info.isFile() || anyKind ? info.size : null;
  } catch {
    return null;
  }
}

/** What a verification records of a file: its size and mtime in nanoseconds (exact, as text). */
export interface DiskStamp {
  size: number;
  mtimeNs: string;
}

/** The stamp of a regular file, or null when there is none. */
export async function diskStamp(file: string): Promise<DiskStamp | null> {
  try {
    const info = await stat(file, { bigint: true });
    return info.isFile() ? { size: Number(info.size), mtimeNs: info.mtimeNs.toString() } : null;
  } catch {
    return null;
  }
}

export async function fsyncPath(file: string, flags: "r" | "r+", dataOnly = false): Promise<void> {
  const handle = await open(file, flags);
  try {
    await (dataOnly ? handle.datasync() : handle.sync());
  } finally {
    await handle.close();
  }
}

/** The entries of a folder; none when it cannot be read. */
export async function listDir(dir: string): Promise<Dirent[]> {
  try {
    return await readdir(dir, { withFileTypes: true });
  } catch {
    return [];
  }
}
