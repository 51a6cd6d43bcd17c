// Turns what the registry module knows (a repository read at one commit, and the artifact
// chosen from its file sets) into the file list `Mirror.fetchVersion` takes: one download
// URL per file pinned to the commit sha, the registry's headers for it, and the sha256 and
// size to check the bytes against. Local sources (a folder on this machine) give `file:`
// URLs, which the mirror copies and hashes while it copies.
import { pathToFileURL } from "node:url";
import type { ChosenArtifact } from "../registry/file-sets.ts";
import { localSourceId, type LocalFile, type LocalListing } from "../registry/local-source.ts";
import { SHORT_SHA_LENGTH, type Registry, type RepoFile, type RepoInfo } from "../registry/types.ts";
import type { MirrorFetchFile } from "./mirror-types.ts";

export interface MirrorFetchPlan {
  /** The mirror's version name: the short commit sha. */
  version: string;
  repo: string;
  /** The full commit sha (or local content id). */
  revision: string;
  files: MirrorFetchFile[];
  totalBytes: number;
}

export interface PlanMirrorFetchOptions {
  /** Gives the download URLs and headers of the repository. */
  registry: Pick<Registry, "downloadUrl" | "requestHeaders">;
  /** The repository as read. */
  repoInfo: RepoInfo;
  /** What to fetch (from `chooseArtifact`); or the files themselves. */
  chosen: Pick<ChosenArtifact<RepoFile>, "files">;
}

/** The fetch of files of a registry repository, pinned to the commit it was read at. */
export function planMirrorFetch(options: PlanMirrorFetchOptions): MirrorFetchPlan {
  const { registry, repoInfo, chosen } = options;
  const files = chosen.files.map((file): MirrorFetchFile => {
    const url = registry.downloadUrl(repoInfo.repo, repoInfo.sha, file.path);
    return {
      path: file.path,
      url,
      sha256: file.sha256,
      size: file.size,
      // Files kept in git itself (config.json, tokenizer files) have no published sha256;
      // their git blob id is the hash of their bytes, so it is checked instead. For LFS
      // files the blob id is the pointer's and says nothing about the content.
      gitBlobId: file.sha256 === null ? file.blobId : null,
      headers: registry.requestHeaders(url),
    };
  });
  return {
    version: repoInfo.shortSha,
    repo: repoInfo.repo,
    revision: repoInfo.sha,
    files,
    totalBytes: files.reduce((sum, file) => sum + (file.size ?? 0), 0),
  };
}

/**
 * The copy of files of a listed local source. Nothing is hashed first: the mirror hashes
 * each file while it copies it (one read instead of two), records that sha256, and serves
 * it as the file's ETag. The version is named after the chosen files' paths, sizes and
 * mtimes (`localSourceId`), so the same untouched files are the same version (a second
 * fetch copies nothing) and unrelated files in the folder do not matter; each file carries
 * the mtime it was listed with, and the mirror refuses to copy it when its size or mtime
 * changed, so the version name never describes other bytes.
 */
export function planLocalMirrorFetch(options: { listing: Pick<LocalListing, "repo">; chosen: Pick<ChosenArtifact<LocalFile>, "files"> }): MirrorFetchPlan {
  const { listing, chosen } = options;
  const revision = localSourceId(chosen.files);
  const files = chosen.files.map(
    (file): MirrorFetchFile => ({
      path: file.path,
      url: pathToFileURL(file.absolute).href,
      sha256: null,
      size: file.size,
      sourceMtimeMs: file.mtimeMs,
    }),
  );
  return {
    version: revision.slice(0, SHORT_SHA_LENGTH),
    repo: listing.repo,
    revision,
    files,
    totalBytes: files.reduce((sum, file) => sum + (file.size ?? 0), 0),
  };
}

/**
 * The mirror's default model name for a repository: `owner--name` for a Hub repository
 * (the `--` the Hub forbids inside names keeps it unambiguous), `local--<folder or file>`
 * for a local source.
 */
export function defaultMirrorModelName(repo: string): string {
  if (repo.startsWith("file:")) {
    const base = decodeURIComponent(new URL(repo).pathname.replace(/\/+$/, "").split("/").pop() ?? "");
    const cleaned = base.replace(/[^A-Za-z0-9._-]+/g, "_").replace(/^[._]+/, "");
    return `local--${cleaned === "" ? "source" : cleaned}`;
  }
  return repo.replace("/", "--");
}
