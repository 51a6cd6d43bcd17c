// Lock files written whole or not at all, for the locks that name their holder in JSON
// (the data dir's, server/data-dir-lock.ts; the llama-server build's,
// engines/llama-server/build-lock.ts). Each write goes to a scratch file named after the
// holder's instance first: a reader never sees half a holder, and a crash leaves only a
// scratch file, not a damaged lock.
import { linkSync, renameSync, rmSync, writeFileSync } from "node:fs";
import path from "node:path";
import { errorCode } from "./errors.ts";

/** What a lock file holds: any JSON, with an id of this holder's instance (for its scratch file's name). */
export interface LockFileHolder {
  instance: string;
}

/** How a lock says that its folder cannot be written (its own words, with its folder). */
export type CannotLock = (dir: string, error: unknown) => Error;

/** Creates `target` holding `holder`, whole or not at all; false when it exists. */
export function createLockFile(target: string, holder: LockFileHolder, cannotLock: CannotLock): boolean {
  const scratch = `${target}.${holder.instance}.new`;
  writeScratch(scratch, holder, cannotLock);
  try {
    // link(2) fails when the target exists, where rename would replace it.
    linkSync(scratch, target);
    return true;
  } catch (error) {
    if (errorCode(error) === "EEXIST") return false;
    throw cannotLock(path.dirname(target), error);
  } finally {
    rmSync(scratch, { force: true });
  }
}

/** Replaces `target` with `holder`, whole. */
export function replaceLockFile(target: string, holder: LockFileHolder, cannotLock: CannotLock): void {
  const scratch = `${target}.${holder.instance}.new`;
  writeScratch(scratch, holder, cannotLock);
  try {
    renameSync(scratch, target);
  } catch (error) {
    rmSync(scratch, { force: true });
    throw cannotLock(path.dirname(target), error);
  }
}

function writeScratch(file: string, holder: LockFileHolder, cannotLock: CannotLock): void {
  try {
    writeFileSync(file, `${JSON.stringify(holder)}\n`, { mode: 0o644 });
  } catch (error) {
    rmSync(file, { force: true });
    throw cannotLock(path.dirname(file), error);
  }
}
