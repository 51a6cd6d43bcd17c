// A small file system of its own for tests of a full disk: a tmpfs of a few MiB that a
// test can fill to the last byte and free again. Mounting needs root (CAP_SYS_ADMIN);
// where that is not allowed, `mountSmallDisk` says why and the test reports a skip with it.
import { spawnSync } from "node:child_process";
import { closeSync, mkdtempSync, openSync, rmSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { errorCode } from "../../src/core/errors.ts";

export interface SmallDisk {
  root: string;
  /** Writes a filler file until the file system has no byte left. */
  fill(): void;
  /** Deletes the filler. */
  free(): void;
  unmount(): void;
}

export function mountSmallDisk(sizeMiB: number): SmallDisk | { problem: string } {
  const root = mkdtempSync(path.join(tmpdir(), "llmgw-disk-"));
  const mounted = spawnSync("mount", ["-t", "tmpfs", "-o", `size=${sizeMiB}m,mode=0700`, "tmpfs", root], { encoding: "utf8" });
  if (mounted.status !== 0) {
    rmSync(root, { recursive: true, force: true });
    return { problem: `mount -t tmpfs failed (${mounted.error?.message ?? mounted.stderr.trim()})` };
  }
  const filler = path.join(root, "filler");
  return {
    root,
    fill() {
      const fd = openSync(filler, "a");
      try {
        // Big blocks first, then small ones, until the very last block is taken.
        for (const size of [1 << 20, 4096, 512, 1]) {
          const block = Buffer.alloc(size);
          for (;;) {
            try {
              writeSync(fd, block);
            } catch (error) {
              if (errorCode(error) === "ENOSPC") break;
              throw error;
            }
          }
        }
      } finally {
        closeSync(fd);
      }
    },
    free() {
      rmSync(filler, { force: true });
    },
    unmount() {
      spawnSync("umount", [root]);
      rmSync(root, { recursive: true, force: true });
    },
  };
}
