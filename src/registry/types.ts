// The shapes the registry module hands to the rest of llmgw. A repository on the Hub comes
// back as a `RepoInfo`; a local file or folder is listed into the same path-and-size file
// list (src/registry/local-source.ts), so the file-set classifier, the plan and the mirror
// do not care where the weights come from.
/** One file of a repository at one commit. */
export interface RepoFile {
  /** Path inside the repository, with `/` separators, already sanitised (no `..`, not absolute). */
  path: string;
  /** Size in bytes of the real content (for LFS files, the LFS object's size, not the pointer's). */
  size: number;
  /**
   * sha256 of the content, lowercase hex. From the Hub this is the LFS object id, so it is
   * null for small files kept in git itself (config.json and friends); check those against
   * `blobId` instead. Hashed local files (`hashLocalFiles`) always carry it.
   */
  sha256: string | null;
  /** The git blob id (sha1 of `blob <size>\0<content>`, or of the LFS pointer for LFS files). */
  blobId: string;
}

export interface RepoInfo {
  /** `owner/name`. */
  repo: string;
  /** The revision that was asked for (`main` when none was given). */
  revision: string;
  /** The full commit sha the revision pointed at when read (40 hex). */
  sha: string;
  /** The first 12 hex characters of `sha`: the version name used in mirror paths. */
  shortSha: string;
  /** The Hub's gating mode; false when anyone may download. */
  gated: false | "auto" | "manual";
  private: boolean;
  /** Every file at that commit, sorted by path. Directories are not listed. */
  files: RepoFile[];
}

/** What the serve job needs from a registry; HubClient implements it, tests may pass their own. */
export interface Registry {
  repoInfo(options: { repo: string; revision?: string; signal?: AbortSignal }): Promise<RepoInfo>;
  /** The URL one file is downloaded from, pinned to a commit sha. */
  downloadUrl(repo: string, sha: string, path: string): string;
  /** Headers to send with a request to `url`: Authorization only when `url` is on the registry's own origin. */
  requestHeaders(url: string): Record<string, string>;
  /**
   * The bytes of one small file (a config, an index) at a commit sha, redirects followed
   * with the token kept on the registry's origin. Refused when it is larger than
   * `maxBytes`, whether or not the answer announced its length.
   */
  readSmallFile(options: { repo: string; sha: string; path: string; maxBytes: number; signal?: AbortSignal }): Promise<Buffer>;
}

/** Length of `RepoInfo.shortSha`. */
export const SHORT_SHA_LENGTH = 12;
