// Run folders: each run of a supervisor (start() or unpark()) claims a NEW folder below
// the state root with an exclusive mkdir, never reusing one, so an engine cannot find
// what an earlier run (or someone planting a symlink under a guessed name) left there.
// The engine's home, temp and caches live below it (engine-env.ts) and so do its attempt
// logs (attempt-log.ts). Folders are kept after a run, since their logs explain failures,
// so they pile up: a hosting process calls `pruneRunFolders` at start to delete all but
// the newest ones. Folders of runs active in this process are never deleted.
import { randomBytes } from "node:crypto";
import { lstat, mkdir, readdir, rm } from "node:fs/promises";
import { join, resolve } from "node:path";
import { LlmgwError, describeError, errorCode } from "../core/errors.ts";
import { silentLogger, type Logger } from "../core/log.ts";

/** State folders (absolute) of the runs active in this process; pruneRunFolders never deletes them. */
const activeRunFolders = new Set<string>();

/**
 * Creates a new run folder for `replicaId` below `stateRoot` (with home/, tmp/ and cache/
 * inside) and marks it active until `releaseRunFolder`. Returns its absolute path.
 */
export async function claimRunFolder(stateRoot: string, replicaId: string): Promise<string> {
  const root = resolve(stateRoot);
  await mkdir(root, { recursive: true, mode: 0o700 });
  // Short names: TMPDIR lives below and Unix socket paths are limited to 107 bytes.
  const safeId = replicaId.replace(/[^A-Za-z0-9._-]/g, "_").slice(0, 24) || "replica";
  for (let tries = 0; tries < 8; tries += 1) {
    const dir = join(root, `${safeId}-${Date.now().toString(36)}-${randomBytes(3).toString("hex")}`);
    try {
      // Not recursive: an existing folder (or a symlink planted under that name) must fail, never be reused.
      await mkdir(dir, { mode: 0o700 });
    } catch (error) {
      if (errorCode(error) === "EEXIST") continue;
      throw error;
    }
    // Registered at once, so a concurrent pruneRunFolders cannot take it while it is set up.
    activeRunFolders.add(dir);
    try {
      for (const sub of ["home", "tmp", "cache"]) await mkdir(join(dir, sub), { mode: 0o700 });
    } catch (error) {
      activeRunFolders.delete(dir);
      throw error;
    }
    return dir;
  }
  throw new Error(`no unused folder name found below ${root}`);
}

/** The run is over (stopped, or unparked into a new run): its folder may be pruned from now on. */
export function releaseRunFolder(dir: string): void {
  activeRunFolders.delete(dir);
}

/** A run folder's name: `<replica id, made safe>-<creation time, base 36 ms>-<6 hex>` (see claimRunFolder). */
const RUN_FOLDER_NAME = /^[A-Za-z0-9._-]{1,24}-([0-9a-z]{1,11})-[0-9a-f]{6}$/;

export const DEFAULT_RUN_FOLDERS_KEPT = 20;

export interface PruneRunFoldersOptions {
  /** The supervisors' `stateRoot`. A root that does not exist has nothing to prune. */
  stateRoot: string;
  /** How many of the newest run folders to keep, whatever their replica. Default 20. */
  keep?: number;
  /** Further folders never to delete: absolute paths, or names below stateRoot. */
  protect?: ReadonlySet<string>;
  logger?: Logger;
}

export interface PruneRunFoldersResult {
  /** Absolute paths of the folders deleted. */
  removed: string[];
  /** Run folders left in place (the newest `keep`, the protected and the active ones). */
  kept: number;
  /** Folders that could not be deleted, with the reason (also logged). */
  failed: Array<{ path: string; error: string }>;
}

/**
 * Deletes the oldest run folders below `stateRoot` beyond the newest `keep`. Every run
 * (start() or unpark()) claims a new folder and keeps it afterwards, for its attempt logs,
 * so without pruning they accumulate forever. Only entries named like a run folder that
 * are real folders (not symlinks) are considered; age comes from the creation time in the
 * name. Folders of runs active in this process (starting, ready, failed or parked; from
 * claim until stop() or unpark()) and those in `protect` are never deleted. Meant to be
 * called when an agent starts; safe to call at any time.
 */
export async function pruneRunFolders(options: PruneRunFoldersOptions): Promise<PruneRunFoldersResult> {
  const keep = options.keep ?? DEFAULT_RUN_FOLDERS_KEPT;
  if (!Number.isInteger(keep) || keep < 0) {
    throw new LlmgwError({ code: "invalid_keep", status: 500, message: `pruneRunFolders: keep must be a whole number of at least 0, got ${keep}.` });
  }
  const root = resolve(options.stateRoot);
  const log = options.logger ?? silentLogger();
  const protect = new Set([...(options.protect ?? [])].map((entry) => resolve(root, entry)));
  let names: string[];
  try {
    names = await readdir(root);
  } catch (error) {
    if (errorCode(error) === "ENOENT") return { removed: [], kept: 0, failed: [] };
    throw error;
  }
  const folders: Array<{ path: string; createdAt: number }> = [];
  for (const name of names) {
    const match = RUN_FOLDER_NAME.exec(name);
    if (!match) continue;
    const path = join(root, name);
    try {
      if (!(await lstat(path)).isDirectory()) continue;
    } catch {
      continue;
    }
    folders.push({ path, createdAt: parseInt(match[1] as string, 36) });
  }
  // Newest first; equal times (same millisecond) in a fixed order.
  folders.sort((a, b) => b.createdAt - a.createdAt || (a.path < b.path ? 1 : -1));
  const result: PruneRunFoldersResult = { removed: [], kept: 0, failed: [] };
  for (const [index, folder] of folders.entries()) {
    // Checked right before each deletion: a run may have claimed a folder meanwhile.
    if (index < keep || protect.has(folder.path) || activeRunFolders.has(folder.path)) {
      result.kept += 1;
      continue;
    }
    try {
      await rm(folder.path, { recursive: true, force: true });
      result.removed.push(folder.path);
    } catch (error) {
      log.warn({ err: error, path: folder.path }, "could not delete an old engine run folder");
      result.failed.push({ path: folder.path, error: describeError(error) });
    }
  }
  if (result.removed.length > 0) log.info({ stateRoot: root, removed: result.removed.length, kept: result.kept }, "deleted old engine run folders");
  return result;
}
