// Hashing the mirror's bytes: the running sha256 (and git blob id) of a download, the
// comparison with what the registry published, and hashing a whole file on disk again
// (a resume after a restart, a verification, a file changed since it was verified).
import { createHash, type Hash } from "node:crypto";
import { createReadStream } from "node:fs";
import type { MirrorFetchFile } from "./mirror-types.ts";

export const READ_HIGH_WATER_MARK = 1024 * 1024;

/** sha256 of the content, plus git's blob id when one is to be checked. */
export class ContentHasher {
  bytes = 0;
  readonly blobHeaderSize: number | null;
  readonly #sha256: Hash;
  readonly #blob: Hash | null;

  constructor(blobHeaderSize: number | null) {
    this.blobHeaderSize = blobHeaderSize;
    this.#sha256 = createHash("sha256");
    // git's blob id is sha1 over `blob <size>\0` and the content.
    this.#blob = blobHeaderSize === null ? null : createHash("sha1").update(`blob ${blobHeaderSize}\0`);
  }

  update(chunk: Buffer): void {
    this.#sha256.update(chunk);
    this.#blob?.update(chunk);
    this.bytes += chunk.length;
  }

  /** The digests so far; the hasher stays usable (copies are digested). */
  digest(): { sha256: string; blobId: string | null } {
    return { sha256: this.#sha256.copy().digest("hex"), blobId: this.#blob === null ? null : this.#blob.copy().digest("hex") };
  }
}

/** The size in git's blob header when the file is checked by its blob id (no published sha256); else null. */
export function blobHeaderSize(spec: MirrorFetchFile): number | null {
  return spec.sha256 === null && spec.gitBlobId !== undefined && spec.gitBlobId !== null && spec.size !== null ? spec.size : null;
}

/** How the digests differ from what the registry published, in words; null when they match. */
export function checksumProblem(spec: MirrorFetchFile, digest: { sha256: string; blobId: string | null }): string | null {
  if (spec.sha256 !== null && digest.sha256 !== spec.sha256) {
    return `the registry published sha256 ${spec.sha256}, the downloaded bytes have sha256 ${digest.sha256}`;
  }
  if (spec.sha256 === null && digest.blobId !== null && spec.gitBlobId !== undefined && spec.gitBlobId !== null && digest.blobId !== spec.gitBlobId) {
    return `the registry published git blob id ${spec.gitBlobId}, the downloaded bytes have ${digest.blobId} (sha256 ${digest.sha256})`;
  }
  return null;
}

/**
 * Hashes the first `bytes` bytes of `file` into `hasher` (all of it when `bytes` is
 * undefined), reporting progress as it reads. Returns the bytes read.
 */
export async function hashFileInto(
  file: string,
  hasher: ContentHasher,
  options: { bytes?: number; signal?: AbortSignal; onBytes?: (done: number) => void } = {},
): Promise<number> {
  if (options.bytes === 0) return 0;
  const stream = createReadStream(file, {
    start: 0,
    ...(options.bytes === undefined ? {} : { end: options.bytes - 1 }),
    highWaterMark: READ_HIGH_WATER_MARK,
    ...(options.signal === undefined ? {} : { signal: options.signal }),
  });
  let done = 0;
  for await (const chunk of stream) {
    hasher.update(chunk as Buffer);
    done += (chunk as Buffer).length;
    options.onBytes?.(done);
  }
  return done;
}
