// The identity check of a replica's weights, run before every engine start (DESIGN.md
// "Engine supervision (agent)"): each file the engine will load must be there as a regular
// file, not a symbolic link, with the size and sha256 the server published. A link is
// refused rather than followed because it can be re-pointed after the check.
//
// Hashing a 100 GB model takes minutes, and an engine restarts often (crash backoff, a new
// definition), so a verified file is remembered by its stamp: device, inode, size, mtime
// and ctime in nanoseconds. The next check with the same stamp skips hashing; any change
// of stamp means hash again. ctime is in the stamp because no one can set it: a file whose
// bytes were changed and whose mtime was put back (`touch -d`, `utimes`) still shows a new
// ctime. The memo is kept in memory and, when `memoFile` is given, in a JSON file written
// atomically, so an agent restart does not re-hash the node's weights either.
import type { BigIntStats } from "node:fs";
import { lstat, mkdir, readFile, readlink, rename, writeFile } from "node:fs/promises";
import path from "node:path";
import { BadRequestError, describeError, errorCode } from "../core/errors.ts";
import { silentLogger, type Logger } from "../core/log.ts";
import { ContentHasher, hashFileInto } from "../mirror/content-hash.ts";

/** One file an engine will load, with what the server published for it. */
export interface ExpectedWeightsFile {
  /** Absolute path on this node. */
  path: string;
  bytes: number;
  /** Lowercase hex. */
  sha256: string;
}

/** What identifies a file's bytes on disk without reading them; exact, as text. */
export interface IdentityStamp {
  dev: string;
  ino: string;
  size: number;
  mtimeNs: string;
  ctimeNs: string;
}

interface MemoEntry extends IdentityStamp {
  sha256: string;
}

export type WeightsRefusal =
  | "weights_missing"
  | "weights_symlink"
  | "weights_not_file"
  | "weights_size_mismatch"
  | "weights_sha256_mismatch"
  | "weights_changed"
  | "weights_unreadable";

/** A weights file that failed the identity check; `file` is its path, `code` says how. */
export class WeightsIdentityError extends BadRequestError {
  readonly file: string;

  constructor(message: string, detail: { code: WeightsRefusal; file: string; cause?: unknown }) {
    super(message, { code: detail.code, ...(detail.cause === undefined ? {} : { cause: detail.cause }) });
    this.file = detail.file;
  }
}

export interface WeightsIdentityOptions {
  /** Where verified stamps are kept across agent restarts (for example DATA_DIR/weights-verified.json). */
  memoFile?: string;
  /**
   * The node's weight cache folder. A file below it that fails is one the agent fetches
   * again (src/agent/weight-cache.ts); any other file is the operator's to restore, and the
   * messages say which.
   */
  cacheRoot?: string;
  logger?: Logger;
}

const MEMO_VERSION = 1;

export class WeightsIdentity {
  readonly #memoFile: string | undefined;
  readonly #cacheRoot: string | undefined;
  readonly #logger: Logger;
  readonly #memo = new Map<string, MemoEntry>();
  #loaded: Promise<void> | null = null;
  /** Memo writes, one after the other, so the file always holds a complete JSON document. */
  #saving: Promise<void> = Promise.resolve();
  /** Hashes in progress by path and stamp, so two replicas starting at once read the file once. */
  readonly #hashing = new Map<string, { promise: Promise<string>; signal: AbortSignal | undefined }>();
  #hashed = 0;

  constructor(options: WeightsIdentityOptions = {}) {
    this.#memoFile = options.memoFile === undefined ? undefined : path.resolve(options.memoFile);
    this.#cacheRoot = options.cacheRoot === undefined ? undefined : path.resolve(options.cacheRoot);
    this.#logger = options.logger ?? silentLogger();
  }

  /** How many files this instance has read and hashed (a check that reused a stamp does not count). */
  hashedCount(): number {
    return this.#hashed;
  }

  /**
   * Checks each file in order and resolves when all pass; rejects with a
   * `WeightsIdentityError` naming the first that fails, or with the abort reason.
   */
  async verify(files: readonly ExpectedWeightsFile[], signal?: AbortSignal): Promise<void> {
    await this.#load();
    for (const file of files) {
      signal?.throwIfAborted();
      await this.#verifyOne(file, signal);
    }
  }

  /**
   * Records `file` as verified with its current stamp, for a caller that hashed its bytes
   * itself while writing them (the weight cache's download): the next `verify` with the
   * same stamp does not read the file again. The file must be a regular file of `bytes` bytes.
   */
  async remember(file: ExpectedWeightsFile): Promise<void> {
    await this.#load();
    const absolute = path.resolve(file.path);
    const stamp = await this.#stampOf(absolute, file);
    this.#memo.set(absolute, { ...stamp, sha256: file.sha256 });
    await this.#save();
  }

  /** Forgets every file at or below `target` (a cache version being removed). */
  async forget(target: string): Promise<void> {
    await this.#load();
    const absolute = path.resolve(target);
    let changed = false;
    for (const key of [...this.#memo.keys()]) {
      if (key === absolute || key.startsWith(absolute + path.sep)) changed = this.#memo.delete(key) || changed;
    }
    if (changed) await this.#save();
  }

  async #verifyOne(file: ExpectedWeightsFile, signal: AbortSignal | undefined): Promise<void> {
    const absolute = path.resolve(file.path);
    const stamp = await this.#stampOf(absolute, file);
    const known = this.#memo.get(absolute);
    if (known !== undefined && known.sha256 === file.sha256 && sameStamp(known, stamp)) return;

    const actual = await this.#sharedHash(absolute, stamp, signal);
    if (actual !== file.sha256) {
      await this.#drop(absolute);
      throw this.#refuse(
        absolute,
        "weights_sha256_mismatch",
        `${absolute} has sha256 ${actual}, but the server published ${file.sha256} for it (both ${file.bytes} bytes): ${known === undefined ? "these are not the published bytes" : "its bytes were changed on this node after they were verified"}.`,
      );
    }
    // Bytes read while the file was being changed prove nothing about the file now.
    const after = await this.#stampOf(absolute, file);
    if (!sameStamp(stamp, after)) {
      await this.#drop(absolute);
      throw this.#refuse(
        absolute,
        "weights_changed",
        `${absolute} was modified while it was being verified (its mtime, ctime or inode changed during hashing).`,
      );
    }
    this.#memo.set(absolute, { ...stamp, sha256: file.sha256 });
    this.#logger.info({ file: absolute, bytes: file.bytes }, "weights verified");
    await this.#save();
  }

  /** The file's sha256, read once for all callers checking the same stamp at the same time. */
  async #sharedHash(file: string, stamp: IdentityStamp, signal: AbortSignal | undefined): Promise<string> {
    const key = `${file}\u0000${stampKey(stamp)}`;
    for (;;) {
      let hashing = this.#hashing.get(key);
      if (hashing === undefined) {
        const started = { promise: this.#hash(file, signal).finally(() => this.#hashing.delete(key)), signal };
        this.#hashing.set(key, started);
        hashing = started;
      }
      try {
        return await hashing.promise;
      } catch (error) {
        // The caller that started the read gave up; this one has not, so it reads itself.
        if (hashing.signal !== signal && hashing.signal?.aborted === true && signal?.aborted !== true) continue;
        throw error;
      }
    }
  }

  async #hash(file: string, signal: AbortSignal | undefined): Promise<string> {
    const hasher = new ContentHasher(null);
    try {
      await hashFileInto(file, hasher, signal === undefined ? {} : { signal });
    } catch (error) {
      if (signal?.aborted === true) throw signal.reason ?? error;
      throw this.#refuse(file, "weights_unreadable", `${file} could not be read (${errorCode(error) ?? describeError(error)}).`, error);
    }
    this.#hashed += 1;
    return hasher.digest().sha256;
  }

  /** The file's stamp after the checks that need no reading: there, a regular file, not a link, the published size. */
  async #stampOf(file: string, expected: ExpectedWeightsFile): Promise<IdentityStamp> {
    let info: BigIntStats;
    try {
      info = await lstat(file, { bigint: true });
    } catch (error) {
      const code = errorCode(error);
      if (code === "ENOENT" || code === "ENOTDIR") {
        await this.#drop(file);
        throw this.#refuse(file, "weights_missing", `${file} does not exist (expected ${expected.bytes} bytes with sha256 ${expected.sha256}).`, error);
      }
      throw this.#refuse(
        file,
        "weights_unreadable",
        `${file} cannot be reached (${code ?? describeError(error)}): the agent's user needs search permission on every folder above it.`,
        error,
      );
    }
    if (info.isSymbolicLink()) {
      const target = await readlink(file).catch(() => "?");
      await this.#drop(file);
      throw this.#refuse(
        file,
        "weights_symlink",
        `${file} is a symbolic link (to ${target}); weights must be the file itself, since a link can be re-pointed after the check.`,
      );
    }
    if (!info.isFile()) {
      await this.#drop(file);
      throw this.#refuse(
        file,
        "weights_not_file",
        `${file} is ${info.isDirectory() ? "a folder" : "not a regular file"}; a weights file of ${expected.bytes} bytes was expected.`,
      );
    }
    const size = Number(info.size);
    if (size !== expected.bytes) {
      await this.#drop(file);
      throw this.#refuse(
        file,
        "weights_size_mismatch",
        `${file} is ${size} bytes, but the server published ${expected.bytes} bytes (sha256 ${expected.sha256}) for it.`,
      );
    }
    return { dev: info.dev.toString(), ino: info.ino.toString(), size, mtimeNs: info.mtimeNs.toString(), ctimeNs: info.ctimeNs.toString() };
  }

  #refuse(file: string, code: WeightsRefusal, what: string, cause?: unknown): WeightsIdentityError {
    const cached = this.#cacheRoot !== undefined && file.startsWith(this.#cacheRoot + path.sep);
    const next = cached
      ? "The file is in this node's weight cache: the agent removes it and fetches it again from the server's mirror before the engine starts."
      : code === "weights_symlink"
        ? "Replace the link with the file itself (or point the model at the file's real path); the engine is not started until then."
        : "Restore the file as it was published (or change the model's definition); the engine is not started until then.";
    return new WeightsIdentityError(`Weights refused before the engine start: ${what} ${next}`, { code, file, ...(cause === undefined ? {} : { cause }) });
  }

  async #drop(file: string): Promise<void> {
    if (this.#memo.delete(file)) await this.#save();
  }

  #load(): Promise<void> {
    this.#loaded ??= this.#read();
    return this.#loaded;
  }

  async #read(): Promise<void> {
    if (this.#memoFile === undefined) return;
    let text: string;
    try {
      text = await readFile(this.#memoFile, "utf8");
    } catch (error) {
      if (errorCode(error) !== "ENOENT")
        this.#logger.warn({ file: this.#memoFile, err: describeError(error) }, "could not read the verified-weights memo; files are hashed again");
      return;
    }
    try {
      const parsed = JSON.parse(text) as { version?: unknown; files?: unknown };
      if (parsed.version !== MEMO_VERSION || typeof parsed.files !== "object" || parsed.files === null) throw new Error(`not a version ${MEMO_VERSION} memo`);
      for (const [file, entry] of Object.entries(parsed.files as Record<string, unknown>)) {
        if (isMemoEntry(entry)) this.#memo.set(file, entry);
      }
    } catch (error) {
      // A damaged memo costs a re-hash, never a wrong answer: start empty.
      this.#logger.warn({ file: this.#memoFile, err: describeError(error) }, "the verified-weights memo is unreadable; files are hashed again");
    }
  }

  #save(): Promise<void> {
    const memoFile = this.#memoFile;
    if (memoFile === undefined) return Promise.resolve();
    this.#saving = this.#saving.then(async () => {
      const text = JSON.stringify({ version: MEMO_VERSION, files: Object.fromEntries(this.#memo) }, null, 1);
      const temporary = `${memoFile}.${process.pid}.tmp`;
      try {
        await mkdir(path.dirname(memoFile), { recursive: true });
        await writeFile(temporary, text);
        await rename(temporary, memoFile);
      } catch (error) {
        // Losing the memo costs a re-hash after a restart, not a start.
        this.#logger.warn({ file: memoFile, err: describeError(error) }, "could not write the verified-weights memo");
      }
    });
    return this.#saving;
  }
}

function sameStamp(a: IdentityStamp, b: IdentityStamp): boolean {
  return a.dev === b.dev && a.ino === b.ino && a.size === b.size && a.mtimeNs === b.mtimeNs && a.ctimeNs === b.ctimeNs;
}

function stampKey(stamp: IdentityStamp): string {
  return `${stamp.dev}:${stamp.ino}:${stamp.size}:${stamp.mtimeNs}:${stamp.ctimeNs}`;
}

function isMemoEntry(value: unknown): value is MemoEntry {
  if (typeof value !== "object" || value === null) return false;
  const entry = value as Record<string, unknown>;
  return (
    typeof entry.sha256 === "string" &&
    typeof entry.size === "number" &&
    ["dev", "ino", "mtimeNs", "ctimeNs"].every((field) => typeof entry[field] === "string")
  );
}
