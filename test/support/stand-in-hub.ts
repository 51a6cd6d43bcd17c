// A stand-in for the Hugging Face Hub, for tests and benchmarks that cannot reach the real
// one. It is a real node:http server on loopback that speaks the Hub's HTTP API shapes from
// reference/protocols.md §1 (huggingface_hub's hf_api.py, file_download.py and _http.py):
//
// - `GET /api/models/{repo}` and `/api/models/{repo}/revision/{rev}`: model info (`id`,
//   `sha`, `private`, `gated` "auto"/"manual"/false, `siblings[{rfilename}]`; with
//   `?blobs=true` also size, blobId and `lfs {size, sha256, pointerSize}`).
// - `GET /api/models/{repo}/tree/{rev}[/{path}]?recursive=true`: entries `{type, oid, size,
//   path, lfs?: {oid (the sha256), size, pointerSize}}`, paginated with a GitHub-style
//   `Link: <absolute url with ?cursor=…>; rel="next"` header like the real Hub.
// - `GET|HEAD /{repo}/resolve/{rev}/{path}`: for LFS files a 302 to an absolute CDN URL on
//   another host name (`localhost` instead of `127.0.0.1`, like huggingface.co → its CDN)
//   with `X-Repo-Commit`, `X-Linked-Etag: "<sha256>"` and `X-Linked-Size`; small files kept
//   in git answer 200 directly with `ETag: "<git blob id>"`. The CDN path serves the bytes
//   with `Range` (206 + Content-Range, 416) and checks no token, as a signed URL would.
// - Errors as the real Hub sends them, with `X-Error-Code`: a gated repository's metadata
//   and file list are public, but downloads answer 401 `GatedRepo` without a token and 403
//   `GatedRepo` with a token that is not approved. A missing (or private, inaccessible)
//   repository answers 401 `RepoNotFound` to anonymous requests and 404 `RepoNotFound` to
//   authenticated ones, as the real Hub does; an unknown revision 404 `RevisionNotFound`;
//   an unknown file 404 `EntryNotFound`; a disabled repository 403 with
//   `X-Error-Message: Access to this resource is disabled.`
//
// Not modelled: Xet-backed downloads (`X-Xet-Hash`, xet `Link` rels), rate limits unless a
// fault asks for them, renamed-repository redirects, tags and refs listings.
//
// Faults (`setFault`) make it misbehave the ways a registry does: answer late or never,
// reset the connection, drop it after N body bytes, serve bytes that do not match the
// published sha256, send a body without Content-Length (chunked, as a streaming proxy or
// CDN may), or answer with an error status.
import { createHash } from "node:crypto";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { Readable, Transform, type TransformCallback } from "node:stream";
import { pipeline } from "node:stream/promises";

export interface ByteRange {
  /** First byte, inclusive. */
  start: number;
  /** Last byte, inclusive. */
  end: number;
}

export interface StandInFile {
  path: string;
  /**
   * The bytes, or a generator for large synthetic files (so a 1 GiB benchmark file is never
   * held in memory). A generator that declares a parameter is given the byte range to
   * produce; one without parameters is read from the start and the server skips ahead.
   */
  content: Buffer | ((range?: ByteRange) => Readable);
  /** Required with a generator. */
  size?: number;
  /** Required with a generator (the server never reads a generator to hash it). */
  sha256?: string;
  /** Stored in LFS (redirect to the CDN, `lfs` in listings). Default: weights-like extensions, files over 10 MiB, and generators. */
  lfs?: boolean;
}

export interface StandInRepo {
  /** `owner/name`. */
  name: string;
  /** Branch or tag → full commit sha. Default: `main` → a sha derived from the name. */
  revisions?: Record<string, string>;
  /** Different files at some commits (keyed by full sha); other commits have `files`. */
  filesAt?: Record<string, StandInFile[]>;
  gated?: false | "auto" | "manual" | boolean;
  /** Tokens with access to a gated or private repository. */
  approvedTokens?: string[];
  private?: boolean;
  disabled?: boolean;
  files: StandInFile[];
}

export type StandInFault = {
  /** Which requests: a path prefix (`/cdn/`, `/api/`) or a RegExp over the path. Default: all. */
  match?: string | RegExp;
  method?: string;
  /** How many matching requests it applies to before it is used up. Default: every one. */
  times?: number;
} & (
  | { kind: "delay"; ms: number }
  | { kind: "hang" }
  | { kind: "reset" }
  | { kind: "drop"; afterBytes: number }
  | { kind: "corrupt"; offset?: number }
  | { kind: "chunked" }
  | { kind: "status"; status: number; headers?: Record<string, string>; body?: string }
);

export interface StandInRequest {
  method: string;
  /** Path and query as received. */
  url: string;
  path: string;
  authorization: string | undefined;
  range: string | undefined;
  /** Filled in when the answer has been sent; undefined when the connection was cut first. */
  status?: number;
}

export interface StandInHubOptions {
  repos: StandInRepo[];
  /** Tree entries per page. Default 1000. */
  pageSize?: number;
  /** Host name of the CDN that LFS downloads redirect to. Default `localhost` (another host than the API's `127.0.0.1`). */
  cdnHost?: string;
  /** When set, any other token is rejected with 401 "Invalid credentials in Authorization header". */
  validTokens?: string[];
}

export interface StandInHub {
  /** The endpoint, e.g. `http://127.0.0.1:41234` (use as --registry / HF_ENDPOINT). */
  url: string;
  /** Origin of the CDN that LFS downloads redirect to. */
  cdnUrl: string;
  /** Every request received, in order. */
  requests: StandInRequest[];
  setFault(fault: StandInFault | StandInFault[] | null): void;
  /** Adds or replaces a repository (for example to publish a new revision). */
  putRepo(repo: StandInRepo): void;
  removeRepo(name: string): void;
  close(): Promise<void>;
}

interface PreparedFile {
  path: string;
  size: number;
  sha256: string;
  blobId: string;
  lfs: boolean;
  pointerSize: number;
  open(range: ByteRange): Readable;
}

interface PreparedRepo {
  source: StandInRepo;
  revisions: Record<string, string>;
  gated: false | "auto" | "manual";
  files: Map<string, Map<string, PreparedFile>>;
}

const LFS_EXTENSIONS = /\.(gguf|safetensors|bin|pt|pth|ckpt|onnx|h5|msgpack|model|tflite|npy|npz|pkl|zip|tar|gz|arrow|parquet)$/i;
const LFS_THRESHOLD = 10 * 1024 * 1024;
const EPOCH = "2025-01-01T00:00:00.000Z";

/** A commit-like sha derived from a name, for repositories that do not give their own. */
export function fakeCommitSha(seed: string): string {
  return createHash("sha1").update(`commit ${seed}`).digest("hex");
}

/**
 * A large deterministic file for benchmarks: `size` bytes of a repeating pseudo-random
 * 1 MiB block, served by range without holding the file in memory. Hashing it once here
 * (about 2 s per GiB) gives the sha256 the hub publishes.
 */
export async function syntheticFile(options: { path: string; size: number; seed?: string }): Promise<StandInFile> {
  const blockSize = 1024 * 1024;
  const block = Buffer.alloc(blockSize);
  let state = createHash("sha256")
    .update(options.seed ?? options.path)
    .digest();
  for (let offset = 0; offset < blockSize; offset += state.length) {
    state.copy(block, offset);
    state = createHash("sha256").update(state).digest();
  }
  const generate = (range?: ByteRange): Readable => {
    const start = range?.start ?? 0;
    const end = range?.end ?? options.size - 1;
    let position = start;
    return new Readable({
      read() {
        if (position > end) {
          this.push(null);
          return;
        }
        const within = position % blockSize;
        const length = Math.min(blockSize - within, end - position + 1, 256 * 1024);
        this.push(block.subarray(within, within + length));
        position += length;
      },
    });
  };
  const hash = createHash("sha256");
  for await (const chunk of generate()) hash.update(chunk as Buffer);
  return { path: options.path, size: options.size, sha256: hash.digest("hex"), content: generate, lfs: true };
}

export async function startStandInHub(options: StandInHubOptions): Promise<StandInHub> {
  const pageSize = options.pageSize ?? 1000;
  const repos = new Map<string, PreparedRepo>();
  const byHash = new Map<string, PreparedFile>();
  const requests: StandInRequest[] = [];
  let faults: (StandInFault & { used: number })[] = [];

  const putRepo = (repo: StandInRepo): void => {
    const prepared = prepareRepo(repo);
    repos.set(repo.name.toLowerCase(), prepared);
    for (const files of prepared.files.values()) for (const file of files.values()) if (file.lfs) byHash.set(file.sha256, file);
  };
  for (const repo of options.repos) putRepo(repo);

  const server = createServer((req, res) => {
    const url = new URL(req.url ?? "/", "http://stand-in");
    const record: StandInRequest = {
      method: req.method ?? "GET",
      url: req.url ?? "/",
      path: url.pathname,
      authorization: req.headers.authorization,
      range: req.headers.range,
    };
    requests.push(record);
    res.on("finish", () => {
      record.status = res.statusCode;
    });
    const fault = takeFault(record);
    const run = (): void => {
      try {
        handle({ req, res, url, fault });
      } catch (error) {
        if (!res.headersSent) sendJson(res, 500, { error: String(error) }, {}, undefined);
      }
    };
    if (fault?.kind === "hang") return;
    if (fault?.kind === "reset") {
      req.socket.destroy();
      return;
    }
    if (fault?.kind === "status") {
      send(
        res,
        fault.status,
        { "content-type": "text/plain", ...(fault.headers ?? {}) },
        Buffer.from(fault.body ?? `stand-in fault ${fault.status}`),
        undefined,
      );
      return;
    }
    if (fault?.kind === "delay") {
      const timer = setTimeout(run, fault.ms);
      res.on("close", () => clearTimeout(timer));
      return;
    }
    run();
  });

  function takeFault(record: StandInRequest): StandInFault | undefined {
    for (const fault of faults) {
      if (fault.method !== undefined && fault.method.toUpperCase() !== record.method) continue;
      if (typeof fault.match === "string" && !record.path.startsWith(fault.match)) continue;
      if (fault.match instanceof RegExp && !fault.match.test(record.path)) continue;
      if (fault.times !== undefined && fault.used >= fault.times) continue;
      fault.used += 1;
      return fault;
    }
    return undefined;
  }

  function handle(context: { req: IncomingMessage; res: ServerResponse; url: URL; fault: StandInFault | undefined }): void {
    const { req, res, url, fault } = context;
    const method = req.method ?? "GET";
    let segments: string[];
    try {
      segments = url.pathname.split("/").slice(1).map(decodeURIComponent);
    } catch {
      sendJson(res, 400, { error: "Invalid URL encoding" }, {}, fault);
      return;
    }
    const token = bearer(req.headers.authorization);
    if (token !== undefined && options.validTokens !== undefined && !options.validTokens.includes(token)) {
      sendJson(res, 401, { error: "Invalid credentials in Authorization header" }, { "x-error-message": "Invalid credentials in Authorization header" }, fault);
      return;
    }

    if (segments[0] === "cdn" && segments[1] === "repos" && segments.length === 3 && (method === "GET" || method === "HEAD")) {
      const file = byHash.get(segments[2] ?? "");
      if (file === undefined) {
        sendText(res, 404, "NoSuchKey", fault);
        return;
      }
      serveContent({ req, res, file, headers: { etag: `"${file.sha256}"` }, fault });
      return;
    }

    if (segments[0] === "api" && segments[1] === "models" && segments.length >= 4) {
      if (method !== "GET") {
        sendJson(res, 405, { error: "Method not allowed" }, {}, fault);
        return;
      }
      const name = `${segments[2]}/${segments[3]}`;
      const repo = visibleRepo(res, name, token, fault);
      if (repo === undefined) return;
      const rest = segments.slice(4);
      if (rest.length === 0) modelInfo(res, repo, "main", url, fault);
      else if (rest[0] === "revision" && rest.length === 2) modelInfo(res, repo, rest[1] ?? "", url, fault);
      else if (rest[0] === "tree" && rest.length >= 2) tree(res, repo, rest[1] ?? "", rest.slice(2).join("/"), url, fault);
      else sendJson(res, 404, { error: "Not found" }, {}, fault);
      return;
    }

    if (segments.length >= 5 && segments[2] === "resolve" && (method === "GET" || method === "HEAD")) {
      const name = `${segments[0]}/${segments[1]}`;
      const repo = visibleRepo(res, name, token, fault);
      if (repo === undefined) return;
      if (repo.gated !== false && !(token !== undefined && (repo.source.approvedTokens ?? []).includes(token))) {
        const message =
          token === undefined
            ? `Access to model ${repo.source.name} is restricted. You must have access to it and be authenticated to access it. Please log in.`
            : `Access to model ${repo.source.name} is restricted and you are not in the authorized list. Visit https://huggingface.co/${repo.source.name} to ask for access.`;
        sendJson(res, token === undefined ? 401 : 403, { error: message }, { "x-error-code": "GatedRepo", "x-error-message": message }, fault);
        return;
      }
      const sha = resolveRevision(repo, segments[3] ?? "");
      if (sha === undefined) {
        revisionNotFound(res, segments[3] ?? "", fault);
        return;
      }
      const path = segments.slice(4).join("/");
      const file = repo.files.get(sha)?.get(path) ?? repo.files.get("*")?.get(path);
      if (file === undefined) {
        sendJson(
          res,
          404,
          { error: "Entry not found" },
          { "x-error-code": "EntryNotFound", "x-error-message": "Entry not found", "x-repo-commit": sha },
          fault,
        );
        return;
      }
      if (file.lfs) {
        // Like the real Hub: a redirect to a signed CDN URL on another host, with the file's
        // metadata on the redirect itself (huggingface_hub reads it from this response).
        const location = `${cdnUrl}/cdn/repos/${file.sha256}?Expires=4102444800&Signature=stand-in&Key-Pair-Id=stand-in`;
        const body = Buffer.from(`Found. Redirecting to ${location}`);
        send(
          res,
          302,
          {
            location,
            "content-type": "text/plain; charset=utf-8",
            "x-repo-commit": sha,
            "x-linked-etag": `"${file.sha256}"`,
            "x-linked-size": String(file.size),
            etag: `"${file.sha256}"`,
            "accept-ranges": "bytes",
          },
          method === "HEAD" ? Buffer.alloc(0) : body,
          undefined,
          method === "HEAD" ? body.length : undefined,
        );
        return;
      }
      serveContent({ req, res, file, headers: { etag: `"${file.blobId}"`, "x-repo-commit": sha }, fault });
      return;
    }

    sendJson(res, 404, { error: "Not found" }, {}, fault);
  }

  /** The repository when this caller may see it; otherwise the Hub's answer has been sent. */
  function visibleRepo(res: ServerResponse, name: string, token: string | undefined, fault: StandInFault | undefined): PreparedRepo | undefined {
    const repo = repos.get(name.toLowerCase());
    const hidden = repo === undefined || (repo.source.private === true && !(token !== undefined && (repo.source.approvedTokens ?? []).includes(token)));
    if (hidden) {
      // The real Hub answers 401 to anonymous callers and 404 to authenticated ones, for
      // missing and inaccessible private repositories alike, so neither learns which it is.
      const message = "Repository not found";
      sendJson(res, token === undefined ? 401 : 404, { error: message }, { "x-error-code": "RepoNotFound", "x-error-message": message }, fault);
      return undefined;
    }
    if (repo.source.disabled === true) {
      const message = "Access to this resource is disabled.";
      sendJson(res, 403, { error: message }, { "x-error-message": message }, fault);
      return undefined;
    }
    return repo;
  }

  function revisionNotFound(res: ServerResponse, revision: string, fault: StandInFault | undefined): void {
    const message = `Invalid rev id: ${revision}`;
    sendJson(res, 404, { error: message }, { "x-error-code": "RevisionNotFound", "x-error-message": message }, fault);
  }

  function filesAt(repo: PreparedRepo, sha: string): PreparedFile[] {
    const files = repo.files.get(sha) ?? repo.files.get("*") ?? new Map<string, PreparedFile>();
    return [...files.values()].sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
  }

  function modelInfo(res: ServerResponse, repo: PreparedRepo, revision: string, url: URL, fault: StandInFault | undefined): void {
    const sha = resolveRevision(repo, revision);
    if (sha === undefined) {
      revisionNotFound(res, revision, fault);
      return;
    }
    const blobs = url.searchParams.get("blobs") === "true";
    const files = filesAt(repo, sha);
    const name = repo.source.name;
    const isGguf = files.some((file) => file.path.endsWith(".gguf"));
    sendJson(
      res,
      200,
      {
        _id: createHash("sha1").update(name).digest("hex").slice(0, 24),
        id: name,
        modelId: name,
        author: name.split("/")[0],
        sha,
        lastModified: EPOCH,
        createdAt: EPOCH,
        private: repo.source.private === true,
        gated: repo.gated,
        disabled: false,
        downloads: 0,
        likes: 0,
        library_name: isGguf ? "gguf" : "transformers",
        tags: isGguf ? ["gguf"] : ["transformers", "safetensors"],
        pipeline_tag: "text-generation",
        siblings: files.map((file) =>
          blobs
            ? {
                rfilename: file.path,
                size: file.size,
                blobId: file.blobId,
                ...(file.lfs ? { lfs: { size: file.size, sha256: file.sha256, pointerSize: file.pointerSize } } : {}),
              }
            : { rfilename: file.path },
        ),
        spaces: [],
        usedStorage: files.reduce((total, file) => total + file.size, 0),
      },
      {},
      fault,
    );
  }

  function tree(res: ServerResponse, repo: PreparedRepo, revision: string, under: string, url: URL, fault: StandInFault | undefined): void {
    const sha = resolveRevision(repo, revision);
    if (sha === undefined) {
      revisionNotFound(res, revision, fault);
      return;
    }
    const recursive = url.searchParams.get("recursive") === "true" || url.searchParams.get("recursive") === "True";
    const prefix = under === "" ? "" : `${under}/`;
    const files = filesAt(repo, sha).filter((file) => file.path.startsWith(prefix));
    if (under !== "" && files.length === 0) {
      sendJson(res, 404, { error: `Entry not found: ${under}` }, { "x-error-code": "EntryNotFound", "x-error-message": "Entry not found" }, fault);
      return;
    }
    // Directory entries come before the files in them, as in the real listing.
    const entries: { sortKey: string; entry: Record<string, unknown> }[] = [];
    const dirs = new Set<string>();
    for (const file of files) {
      const rest = file.path.slice(prefix.length).split("/");
      for (let depth = 1; depth < rest.length; depth += 1) {
        if (!recursive && depth > 1) break;
        const dir = prefix + rest.slice(0, depth).join("/");
        if (dirs.has(dir)) continue;
        dirs.add(dir);
        entries.push({ sortKey: dir, entry: { type: "directory", oid: createHash("sha1").update(`tree ${sha} ${dir}`).digest("hex"), size: 0, path: dir } });
      }
      if (!recursive && rest.length > 1) continue;
      entries.push({
        sortKey: file.path,
        entry: {
          type: "file",
          oid: file.blobId,
          size: file.size,
          path: file.path,
          ...(file.lfs ? { lfs: { oid: file.sha256, size: file.size, pointerSize: file.pointerSize } } : {}),
        },
      });
    }
    entries.sort((a, b) => (a.sortKey < b.sortKey ? -1 : a.sortKey > b.sortKey ? 1 : 0));
    const cursor = url.searchParams.get("cursor");
    const offset = cursor === null ? 0 : Number(Buffer.from(cursor, "base64url").toString("utf8"));
    if (!Number.isSafeInteger(offset) || offset < 0) {
      sendJson(res, 400, { error: "Invalid cursor" }, {}, fault);
      return;
    }
    const page = entries.slice(offset, offset + pageSize).map((item) => item.entry);
    const headers: Record<string, string> = {};
    if (offset + pageSize < entries.length) {
      const next = new URL(url.pathname + url.search, hubUrl);
      next.searchParams.set("cursor", Buffer.from(String(offset + pageSize)).toString("base64url"));
      headers.link = `<${next.href}>; rel="next"`;
    }
    sendJson(res, 200, page, headers, fault);
  }

  function resolveRevision(repo: PreparedRepo, revision: string): string | undefined {
    const named = repo.revisions[revision];
    if (named !== undefined) return named;
    const known = new Set([...Object.values(repo.revisions), ...repo.files.keys()]);
    return /^[0-9a-f]{40}$/.test(revision) && known.has(revision) ? revision : undefined;
  }

  function serveContent(context: {
    req: IncomingMessage;
    res: ServerResponse;
    file: PreparedFile;
    headers: Record<string, string>;
    fault: StandInFault | undefined;
  }): void {
    const { req, res, file, fault } = context;
    const headers: Record<string, string> = { ...context.headers, "accept-ranges": "bytes", "content-type": "application/octet-stream" };
    let range: ByteRange = { start: 0, end: file.size - 1 };
    let status = 200;
    const asked = req.headers.range;
    if (asked !== undefined) {
      const parsed = parseRange(asked, file.size);
      if (parsed === "unsatisfiable") {
        send(res, 416, { ...headers, "content-range": `bytes */${file.size}` }, Buffer.alloc(0), undefined);
        return;
      }
      if (parsed !== undefined) {
        range = parsed;
        status = 206;
        headers["content-range"] = `bytes ${range.start}-${range.end}/${file.size}`;
      }
    }
    const length = file.size === 0 ? 0 : range.end - range.start + 1;
    if (req.method === "HEAD" || length === 0) {
      send(res, status, headers, Buffer.alloc(0), undefined, length);
      return;
    }
    let body = file.open(range);
    if (fault?.kind === "corrupt") body = body.pipe(corrupter(range.start, fault.offset ?? Math.floor(file.size / 2)));
    send(res, status, headers, body, fault, length);
  }

  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => resolve());
  });
  const { port } = server.address() as AddressInfo;
  const hubUrl = `http://127.0.0.1:${port}`;
  const cdnUrl = `http://${options.cdnHost ?? "localhost"}:${port}`;

  return {
    url: hubUrl,
    cdnUrl,
    requests,
    setFault(fault) {
      faults = (fault === null ? [] : Array.isArray(fault) ? fault : [fault]).map((f) => ({ ...f, used: 0 }));
    },
    putRepo,
    removeRepo(name) {
      repos.delete(name.toLowerCase());
    },
    async close() {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

function prepareRepo(repo: StandInRepo): PreparedRepo {
  const revisions = repo.revisions ?? { main: fakeCommitSha(repo.name) };
  const files = new Map<string, Map<string, PreparedFile>>();
  files.set("*", new Map(repo.files.map((file) => [file.path, prepareFile(file)])));
  for (const [sha, list] of Object.entries(repo.filesAt ?? {})) files.set(sha, new Map(list.map((file) => [file.path, prepareFile(file)])));
  const gated = repo.gated === undefined || repo.gated === false ? false : repo.gated === true ? "auto" : repo.gated;
  return { source: repo, revisions, gated, files };
}

function prepareFile(file: StandInFile): PreparedFile {
  const content = file.content;
  if (Buffer.isBuffer(content)) {
    const size = content.length;
    const sha256 = createHash("sha256").update(content).digest("hex");
    const lfs = file.lfs ?? (LFS_EXTENSIONS.test(file.path) || size > LFS_THRESHOLD);
    const pointer = lfsPointer(sha256, size);
    return {
      path: file.path,
      size,
      sha256: file.sha256 ?? sha256,
      blobId: lfs ? gitBlobId(pointer) : gitBlobId(content),
      lfs,
      pointerSize: pointer.length,
      open: (range) => Readable.from([content.subarray(range.start, range.end + 1)]),
    };
  }
  if (file.size === undefined || file.sha256 === undefined) {
    throw new Error(`stand-in hub: '${file.path}' has generated content, so it needs size and sha256`);
  }
  const size = file.size;
  const sha256 = file.sha256;
  const pointer = lfsPointer(sha256, size);
  return {
    path: file.path,
    size,
    sha256,
    // A generator is never read to hash it, so it is always an LFS file (its blob id is the pointer's).
    blobId: gitBlobId(pointer),
    lfs: true,
    pointerSize: pointer.length,
    open: (range) => (content.length > 0 ? content(range) : content().pipe(slicer(range))),
  };
}

function lfsPointer(sha256: string, size: number): Buffer {
  return Buffer.from(`version https://git-lfs.github.com/spec/v1\noid sha256:${sha256}\nsize ${size}\n`);
}

function gitBlobId(content: Buffer): string {
  return createHash("sha1").update(`blob ${content.length}\0`).update(content).digest("hex");
}

/** A single `bytes=a-b`, `bytes=a-` or `bytes=-n` range; undefined for forms it ignores (multiple ranges), as servers may. */
function parseRange(header: string, size: number): ByteRange | "unsatisfiable" | undefined {
  const match = /^bytes=(\d*)-(\d*)$/.exec(header.trim());
  if (match === null) return undefined;
  const [, first = "", last = ""] = match;
  if (first === "" && last === "") return undefined;
  if (first === "") {
    const suffix = Number(last);
    if (suffix === 0) return "unsatisfiable";
    return { start: Math.max(0, size - suffix), end: size - 1 };
  }
  const start = Number(first);
  const end = last === "" ? size - 1 : Math.min(Number(last), size - 1);
  if (start >= size || end < start) return "unsatisfiable";
  return { start, end };
}

function bearer(header: string | undefined): string | undefined {
  const match = /^Bearer\s+(.+)$/i.exec(header ?? "");
  return match?.[1]?.trim();
}

function sendJson(res: ServerResponse, status: number, body: unknown, headers: Record<string, string>, fault: StandInFault | undefined): void {
  send(res, status, { "content-type": "application/json; charset=utf-8", ...headers }, Buffer.from(JSON.stringify(body)), fault);
}

function sendText(res: ServerResponse, status: number, text: string, fault: StandInFault | undefined): void {
  send(res, status, { "content-type": "text/plain; charset=utf-8" }, Buffer.from(text), fault);
}

/**
 * Sends an answer; with a `drop` fault, the headers and the first `afterBytes` bytes of
 * the body go out and then the connection is destroyed, as when a link fails mid-transfer.
 */
function send(
  res: ServerResponse,
  status: number,
  headers: Record<string, string>,
  body: Buffer | Readable,
  fault: StandInFault | undefined,
  length?: number,
): void {
  const contentLength = fault?.kind === "chunked" ? undefined : (length ?? (Buffer.isBuffer(body) ? body.length : undefined));
  res.writeHead(status, { ...headers, ...(contentLength === undefined ? {} : { "content-length": String(contentLength) }) });
  if (res.req.method === "HEAD") {
    res.end();
    if (!Buffer.isBuffer(body)) body.destroy();
    return;
  }
  const source = Buffer.isBuffer(body) ? Readable.from([body]) : body;
  if (fault?.kind === "drop") {
    dropAfter(source, res, fault.afterBytes);
    return;
  }
  pipeline(source, res).catch(() => {
    // The client went away: nothing to answer.
  });
}

/**
 * Sends the first `afterBytes` bytes of the body and then closes the connection, as a
 * link that fails mid-transfer does. The socket is ended (not destroyed) so the bytes
 * already written reach the client before the connection closes.
 */
function dropAfter(source: Readable, res: ServerResponse, afterBytes: number): void {
  const socket = res.socket;
  const cut = (): void => {
    source.destroy();
    socket?.end();
  };
  res.flushHeaders();
  if (afterBytes <= 0) {
    cut();
    return;
  }
  let passed = 0;
  source.on("data", (chunk: Buffer) => {
    const part = chunk.subarray(0, afterBytes - passed);
    passed += part.length;
    if (passed >= afterBytes) {
      res.write(part, cut);
    } else {
      res.write(part);
    }
  });
  source.on("end", cut);
  source.on("error", cut);
}

/** Flips the byte at absolute `offset` of the file, for a body that starts at `start`. */
function corrupter(start: number, offset: number): Transform {
  let position = start;
  return new Transform({
    transform(chunk: Buffer, _encoding, callback: TransformCallback) {
      let out = chunk;
      if (offset >= position && offset < position + chunk.length) {
        out = Buffer.from(chunk);
        out[offset - position] = (out[offset - position] ?? 0) ^ 0xff;
      }
      position += chunk.length;
      callback(null, out);
    },
  });
}

/** Skips to `range.start` and stops after `range.end` for a generator that always starts at 0. */
function slicer(range: ByteRange): Transform {
  let position = 0;
  return new Transform({
    transform(chunk: Buffer, _encoding, callback: TransformCallback) {
      const from = Math.max(0, range.start - position);
      const to = Math.min(chunk.length, range.end + 1 - position);
      position += chunk.length;
      callback(null, from < to ? chunk.subarray(from, to) : undefined);
    },
  });
}
