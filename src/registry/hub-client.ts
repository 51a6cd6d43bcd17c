// The registry module: a small client of the Hugging Face Hub HTTP API, the file sets of a
// repository, the choice of artifact, and local files as a stand-in for a hub.
//
// This file is the Hub client. It is our own thin client over undici rather than
// @huggingface/hub because llmgw needs control over what that package hides: the endpoint
// (it ignores HF_ENDPOINT), per-phase timeouts, the tree listing's `Link` pagination, one
// place that turns the Hub's `X-Error-Code` answers into llmgw errors (hub-errors.ts), and headers that
// never carry the token to another host. The shapes it speaks are those of
// reference/protocols.md §1 (from huggingface_hub's hf_api.py, file_download.py, _http.py).
import { setTimeout as sleep } from "node:timers/promises";
import { createHash } from "node:crypto";
import { Agent, request, type Dispatcher } from "undici";
import { z } from "zod";
import { BadRequestError, LlmgwError, UpstreamError, describeError, errorCode } from "../core/errors.ts";
import { backoffDelay } from "../core/backoff.ts";
import { formatBytes } from "../core/format.ts";
import { followRedirects, isSameOrigin } from "./redirects.ts";
import { encodeRepoPath, pathProblem, sanitizeRepoPath, validateRepoName, validateRevision } from "./repo-path.ts";
import { SHORT_SHA_LENGTH, type Registry, type RepoFile, type RepoInfo } from "./types.ts";
import { DEFAULT_REVISION, disabledError, header, hubStatusError, type HubRequestContext, type HubResponse } from "./hub-errors.ts";

// The redirect rules live in redirects.ts (the mirror follows redirects with them too).
export { headersForRedirect, isSameOrigin } from "./redirects.ts";

export const DEFAULT_REGISTRY_ENDPOINT = "https://huggingface.co";
/** The Hub's default branch; what `repoInfo` reports as `revision` when none was asked for. */
export { DEFAULT_REVISION };

/**
 * The registry endpoint: the `--registry` flag, else `HF_ENDPOINT`, else huggingface.co,
 * with trailing slashes removed (as huggingface_hub does with `.rstrip("/")`).
 */
export function resolveRegistryEndpoint(options: { flag?: string | undefined; env?: Record<string, string | undefined> } = {}): string {
  const env = options.env ?? process.env;
  const fromFlag = nonEmpty(options.flag);
  const fromEnv = nonEmpty(env.HF_ENDPOINT);
  const chosen = fromFlag ?? fromEnv ?? DEFAULT_REGISTRY_ENDPOINT;
  const source = fromFlag !== undefined ? "--registry" : fromEnv !== undefined ? "HF_ENDPOINT" : "the default";
  let url: URL;
  try {
    url = new URL(chosen);
  } catch (error) {
    throw new BadRequestError(`Invalid registry endpoint '${chosen}' from ${source}: expected an http(s) URL such as ${DEFAULT_REGISTRY_ENDPOINT}.`, {
      code: "invalid_registry_endpoint",
      param: "registry",
      cause: error,
    });
  }
  if ((url.protocol !== "http:" && url.protocol !== "https:") || url.search !== "" || url.hash !== "" || url.username !== "" || url.password !== "") {
    throw new BadRequestError(
      `Invalid registry endpoint '${chosen}' from ${source}: expected an http(s) URL without query, fragment or credentials, such as ${DEFAULT_REGISTRY_ENDPOINT}.`,
      { code: "invalid_registry_endpoint", param: "registry" },
    );
  }
  return chosen.replace(/\/+$/, "");
}

/** The Hub token from `HF_TOKEN`, or undefined. Never log what this returns. */
export function resolveRegistryToken(env: Record<string, string | undefined> = process.env): string | undefined {
  return nonEmpty(env.HF_TOKEN);
}

/** git's blob id of `content`: sha1 of `blob <size>\0<content>`, which the Hub lists as `oid`. */
export function gitBlobId(content: Buffer): string {
  return createHash("sha1").update(`blob ${content.length}\0`).update(content).digest("hex");
}

export interface HubClientOptions {
  /** Registry base URL, for example from `resolveRegistryEndpoint`. */
  endpoint: string;
  /** Hub token (`HF_TOKEN`); sent only to the endpoint's own origin. */
  token?: string | undefined;
  /**
   * The client runs inside the llmgw server on behalf of a remote caller (`ctl`, the
   * console). The token is then the server's, read from its environment at start, so
   * messages about HF_TOKEN say to set it there, not in the shell that ran ctl.
   */
  inServer?: boolean;
  /** HTTP dispatcher to use; by default the client makes its own Agent with the timeouts below. */
  dispatcher?: Dispatcher;
  /** TCP/TLS connect timeout of the client's own Agent (ignored when `dispatcher` is given). Default 10 s. */
  connectTimeoutMs?: number;
  /** Time to wait for response headers. Default 30 s (undici's own default is 300 s). */
  headersTimeoutMs?: number;
  /** Longest silence while reading a response body. Default 30 s. */
  bodyTimeoutMs?: number;
  /** Extra attempts for a request that failed in a retryable way (timeout, drop, 408/429/5xx). Default 2. */
  retries?: number;
  /** First delay between attempts; doubles each time. Default 500 ms. */
  retryDelayMs?: number;
  userAgent?: string;
}

export interface FileMetadata {
  /** `X-Repo-Commit`: the commit the revision resolved to. */
  commit: string;
  /** `X-Linked-Etag` or `ETag`, without `W/` and quotes: the sha256 for LFS files, the git blob id otherwise. */
  etag: string;
  /** `X-Linked-Size` or `Content-Length`. */
  size: number;
  /** Where the bytes are: the redirect target for LFS files, else the resolve URL itself. */
  location: string;
}

const COMMIT_SHA = /^[0-9a-f]{40}$/;
// A tree page of the real Hub is at most 1000 entries; a model-info answer is a few
// hundred KiB for the largest repositories. This cap only stops a runaway body.
const MAX_JSON_BYTES = 32 * 1024 * 1024;
const MAX_REDIRECTS = 5;
/**
 * The longest wait between two attempts. With the default 2 retries from 500 ms no wait comes
 * near it; it bounds a caller that asks for many retries, as the mirror's downloads are bounded.
 */
const HUB_MAX_RETRY_DELAY_MS = 30_000;
const MAX_TREE_PAGES = 10_000;

const modelInfoSchema = z.object({
  id: z.string().optional(),
  sha: z.string().regex(COMMIT_SHA),
  private: z.boolean().optional(),
  gated: z.union([z.boolean(), z.string()]).nullable().optional(),
  disabled: z.boolean().optional(),
});

const treeEntrySchema = z.object({
  type: z.string(),
  path: z.string(),
  size: z.number().int().nonnegative().optional(),
  oid: z.string().optional(),
  lfs: z
    .object({
      oid: z.string(),
      size: z.number().int().nonnegative(),
      pointerSize: z.number().int().nonnegative().optional(),
    })
    .nullable()
    .optional(),
});
const treePageSchema = z.array(treeEntrySchema);

/**
 * A client of one Hub endpoint. Pins everything to a commit: `repoInfo` resolves the
 * revision to a sha once and lists the files at that sha, so a branch that moves while we
 * read cannot mix two commits.
 */
export class HubClient implements Registry {
  readonly endpoint: string;
  readonly dispatcher: Dispatcher;
  readonly hasToken: boolean;
  readonly #inServer: boolean;
  // A private field, so the token never shows up in util.inspect or JSON.stringify output.
  readonly #token: string | undefined;
  readonly #ownsDispatcher: boolean;
  readonly #headersTimeoutMs: number;
  readonly #bodyTimeoutMs: number;
  readonly #connectTimeoutMs: number;
  readonly #retries: number;
  readonly #retryDelayMs: number;
  readonly #userAgent: string;

  constructor(options: HubClientOptions) {
    this.endpoint = resolveRegistryEndpoint({ flag: options.endpoint, env: {} });
    this.#token = nonEmpty(options.token);
    this.hasToken = this.#token !== undefined;
    this.#inServer = options.inServer === true;
    this.#connectTimeoutMs = options.connectTimeoutMs ?? 10_000;
    this.#headersTimeoutMs = options.headersTimeoutMs ?? 30_000;
    this.#bodyTimeoutMs = options.bodyTimeoutMs ?? 30_000;
    this.#retries = Math.max(0, options.retries ?? 2);
    this.#retryDelayMs = Math.max(0, options.retryDelayMs ?? 500);
    this.#userAgent = options.userAgent ?? "llmgw";
    if (options.dispatcher !== undefined) {
      this.dispatcher = options.dispatcher;
      this.#ownsDispatcher = false;
    } else {
      this.dispatcher = new Agent({
        connect: { timeout: this.#connectTimeoutMs },
        headersTimeout: this.#headersTimeoutMs,
        bodyTimeout: this.#bodyTimeoutMs,
      });
      this.#ownsDispatcher = true;
    }
  }

  /** Closes the client's own Agent; a dispatcher passed in is left to its owner. */
  async close(): Promise<void> {
    if (this.#ownsDispatcher) await this.dispatcher.close();
  }

  /**
   * Reads a repository at a revision: the commit sha and gating from model info, every file
   * with its size and LFS sha256 from the recursive tree listing at that sha (all pages).
   * For a gated repository it also checks, with a HEAD of one file, that the token may
   * download, so a missing approval fails here and not halfway through a download.
   */
  async repoInfo(options: { repo: string; revision?: string; signal?: AbortSignal }): Promise<RepoInfo> {
    const repo = validateRepoName(options.repo);
    const revision = options.revision === undefined ? undefined : validateRevision(options.revision);
    const context: HubRequestContext = { what: "reading repository info", repo, ...(revision === undefined ? {} : { revision }) };
    // Without a revision huggingface_hub asks for the default branch with the plain path.
    const infoUrl =
      revision === undefined ? `${this.endpoint}/api/models/${repo}` : `${this.endpoint}/api/models/${repo}/revision/${encodeURIComponent(revision)}`;
    const info = await this.#getJson(infoUrl, context, modelInfoSchema, options.signal);
    if (info.disabled === true) throw disabledError(repo, this.endpoint);
    const canonical = info.id !== undefined && validRepoId(info.id) ? info.id : repo;
    const gated = normaliseGated(info.gated);
    const files = await this.#listFiles(canonical, info.sha, { ...context, repo: canonical, what: "listing repository files" }, options.signal);
    if (gated !== false) await this.#checkDownloadAccess(canonical, info.sha, files, options.signal);
    return {
      repo: canonical,
      revision: revision ?? DEFAULT_REVISION,
      sha: info.sha,
      shortSha: info.sha.slice(0, SHORT_SHA_LENGTH),
      gated,
      private: info.private ?? false,
      files,
    };
  }

  /**
   * The download URL of one file, `{endpoint}/{repo}/resolve/{sha}/{path}`, with each path
   * segment URL-encoded. Send `requestHeaders(url)` with it and, when following the
   * redirect yourself, `headersForRedirect` (the token is dropped on a cross-host redirect).
   */
  downloadUrl(repo: string, sha: string, path: string): string {
    validateRepoName(repo);
    validateRevision(sha);
    sanitizeRepoPath(path, "file");
    return `${this.endpoint}/${repo}/resolve/${encodeURIComponent(sha)}/${encodeRepoPath(path)}`;
  }

  /** Headers for a request to `url`: a user agent, and Authorization only on the endpoint's origin. */
  requestHeaders(url: string): Record<string, string> {
    const headers: Record<string, string> = { "user-agent": this.#userAgent };
    if (this.#token !== undefined && isSameOrigin(url, this.endpoint)) headers.authorization = `Bearer ${this.#token}`;
    return headers;
  }

  /**
   * The Hub's metadata for one file without downloading it, as huggingface_hub's
   * `get_hf_file_metadata` reads it: a HEAD of the resolve URL with `Accept-Encoding:
   * identity`, following only same-origin redirects (a renamed repository), and reading
   * `X-Repo-Commit`, `X-Linked-Etag`/`ETag` and `X-Linked-Size`/`Content-Length`.
   */
  async fileMetadata(options: { repo: string; revision: string; path: string; signal?: AbortSignal }): Promise<FileMetadata> {
    const repo = validateRepoName(options.repo);
    const revision = validateRevision(options.revision);
    const context: HubRequestContext = { what: `reading metadata of '${options.path}'`, repo, revision, path: options.path };
    const url = this.downloadUrl(repo, revision, options.path);
    return this.#withRetries(async () => {
      // Only relative redirects are followed here, as huggingface_hub does: the answer to
      // an LFS file is a redirect to an absolute CDN URL, and its headers are the metadata.
      const response = await this.#send(url, "HEAD", { "accept-encoding": "identity" }, context, options.signal, "relative");
      if (response.status >= 400) throw await this.#statusError(response, context);
      await response.body.dump();
      const commit = header(response.headers, "x-repo-commit");
      const etag = normaliseEtag(header(response.headers, "x-linked-etag") ?? header(response.headers, "etag"));
      const sizeText = header(response.headers, "x-linked-size") ?? header(response.headers, "content-length");
      const size = sizeText === undefined ? Number.NaN : Number(sizeText);
      if (commit === undefined || etag === undefined || !Number.isSafeInteger(size) || size < 0) {
        throw new UpstreamError(
          `The registry at ${this.endpoint} answered ${context.what} in '${repo}' without X-Repo-Commit, ETag or size headers; it may not be a Hugging Face Hub API.`,
          { code: "registry_bad_response" },
        );
      }
      const location = header(response.headers, "location");
      return { commit, etag, size, location: location === undefined ? response.url : new URL(location, response.url).href };
    }, options.signal);
  }

  /**
   * The bytes of one small file at a commit (config.json, a safetensors index): a GET of
   * its resolve URL that follows every redirect (an LFS file's goes to the CDN, without the
   * token), with this client's dispatcher, timeouts, retries and Hub error mapping. A file
   * larger than `maxBytes` is refused: by its Content-Length before reading, and by
   * counting while reading when the answer does not say.
   */
  async readSmallFile(options: { repo: string; sha: string; path: string; maxBytes: number; signal?: AbortSignal }): Promise<Buffer> {
    const repo = validateRepoName(options.repo);
    const revision = validateRevision(options.sha);
    const context: HubRequestContext = { what: `downloading '${options.path}'`, repo, revision, path: options.path };
    const url = this.downloadUrl(repo, revision, options.path);
    const tooLarge = (size: number | null) =>
      new BadRequestError(
        `'${options.path}' in '${repo}' at ${revision} is ${size === null ? "larger than" : `${formatBytes(size)}, more than`} ${formatBytes(options.maxBytes)}, ` +
          `the most llmgw reads of a small file such as a config or an index; check that the repository holds what its name says.`,
        { code: "file_too_large", param: "file" },
      );
    return this.#withRetries(async () => {
      const response = await this.#send(url, "GET", { "accept-encoding": "identity" }, context, options.signal, "any");
      if (response.status >= 400) throw await this.#statusError(response, context);
      if (response.status !== 200) {
        await response.body.dump().catch(() => undefined);
        const location = header(response.headers, "location");
        throw new UpstreamError(
          `The registry at ${this.endpoint} answered ${response.status} while ${context.what} for '${repo}'` +
            `${location === undefined ? "" : ` (a redirect llmgw does not follow: more than ${MAX_REDIRECTS} hops, or not to http(s))`}.`,
          { code: "registry_bad_response" },
        );
      }
      const declared = Number(header(response.headers, "content-length") ?? Number.NaN);
      if (Number.isSafeInteger(declared) && declared > options.maxBytes) {
        response.body.destroy();
        throw tooLarge(declared);
      }
      return this.#readBody(response, context, options.signal, options.maxBytes, () => tooLarge(null));
    }, options.signal);
  }

  async #listFiles(repo: string, sha: string, context: HubRequestContext, signal: AbortSignal | undefined): Promise<RepoFile[]> {
    const files: RepoFile[] = [];
    const seen = new Set<string>();
    let url: string | undefined = `${this.endpoint}/api/models/${repo}/tree/${sha}?recursive=true&expand=false`;
    const visited = new Set<string>();
    while (url !== undefined) {
      if (visited.has(url) || visited.size >= MAX_TREE_PAGES) {
        throw new UpstreamError(
          `The registry at ${this.endpoint} sent a tree listing for '${repo}' whose pages do not end (page ${visited.size + 1}: ${url}).`,
          {
            code: "registry_bad_response",
          },
        );
      }
      visited.add(url);
      const pageUrl: string = url;
      const page = await this.#withRetries(async () => {
        const response = await this.#get(pageUrl, context, signal);
        const entries = parseOrFail(treePageSchema, await this.#readJson(response, context, signal), this.endpoint, context);
        return { entries, next: nextLink(header(response.headers, "link"), response.url) };
      }, signal);
      for (const entry of page.entries) {
        if (entry.type !== "file") continue;
        const problem = pathProblem(entry.path);
        if (problem !== null) {
          throw new UpstreamError(`The registry at ${this.endpoint} listed a file '${entry.path}' in '${repo}' that llmgw refuses: ${problem}.`, {
            code: "registry_bad_response",
          });
        }
        if (seen.has(entry.path)) continue;
        seen.add(entry.path);
        files.push({
          path: entry.path,
          size: entry.lfs?.size ?? entry.size ?? 0,
          sha256: entry.lfs?.oid.toLowerCase() ?? null,
          blobId: entry.oid ?? "",
        });
      }
      url = page.next;
    }
    files.sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
    return files;
  }

  async #checkDownloadAccess(repo: string, sha: string, files: RepoFile[], signal: AbortSignal | undefined): Promise<void> {
    // The Hub shows a gated repository's metadata and file list to anyone; only downloads
    // need approval. The smallest file is the cheapest to ask about.
    const smallest = files.reduce<RepoFile | undefined>((best, file) => (best === undefined || file.size < best.size ? file : best), undefined);
    if (smallest === undefined) return;
    await this.fileMetadata({ repo, revision: sha, path: smallest.path, ...(signal === undefined ? {} : { signal }) });
  }

  async #getJson<T extends z.ZodType>(url: string, context: HubRequestContext, schema: T, signal: AbortSignal | undefined): Promise<z.output<T>> {
    return this.#withRetries(async () => {
      const response = await this.#get(url, context, signal);
      return parseOrFail(schema, await this.#readJson(response, context, signal), this.endpoint, context);
    }, signal);
  }

  /** A GET that follows same-origin redirects and turns error statuses into llmgw errors. */
  async #get(url: string, context: HubRequestContext, signal: AbortSignal | undefined): Promise<HubResponse> {
    const response = await this.#send(url, "GET", { accept: "application/json" }, context, signal, "same-origin");
    if (response.status >= 300 && response.status < 400) {
      await response.body.dump();
      throw new UpstreamError(
        `The registry at ${this.endpoint} redirected ${context.what} for '${context.repo}' to another host (${header(response.headers, "location") ?? "no location"}); llmgw does not follow that.`,
        {
          code: "registry_bad_response",
        },
      );
    }
    if (response.status >= 400) throw await this.#statusError(response, context);
    return response;
  }

  /**
   * One request plus the redirects `follow` allows, with transport failures classified
   * once, here. `relative`: only a Location without scheme or host (a renamed repository;
   * an LFS file's absolute CDN redirect is handed back, its headers are the metadata).
   * `same-origin`: redirects within the registry. `any`: every http(s) redirect, the token
   * dropped when one leaves the registry's origin (`headersForRedirect`).
   */
  async #send(
    url: string,
    method: "GET" | "HEAD",
    extraHeaders: Record<string, string>,
    context: HubRequestContext,
    signal: AbortSignal | undefined,
    follow: "relative" | "same-origin" | "any",
  ): Promise<HubResponse> {
    const followed = await followRedirects({
      url,
      headers: { ...this.requestHeaders(url), ...extraHeaders },
      maxRedirects: MAX_REDIRECTS,
      follow: (from, to, location) => {
        if (to.protocol !== "http:" && to.protocol !== "https:") return false;
        if (follow === "relative") return !/^[a-z][a-z0-9+.-]*:|^\/\//i.test(location);
        if (follow === "same-origin") return isSameOrigin(to.href, from);
        return true;
      },
      send: async (current, headers) => {
        try {
          return await request(current, {
            dispatcher: this.dispatcher,
            method,
            headers,
            headersTimeout: this.#headersTimeoutMs,
            bodyTimeout: this.#bodyTimeoutMs,
            ...(signal === undefined ? {} : { signal }),
          });
        } catch (error) {
          throw this.#transportError(error, context, current, signal);
        }
      },
    });
    const { response } = followed;
    return { url: followed.url, status: response.statusCode, headers: response.headers, body: response.body };
  }

  /**
   * The whole body, refused (with `tooLarge`) once more than `maxBytes` arrived, so a
   * runaway answer is cut off whether or not it announced its length.
   */
  async #readBody(
    response: HubResponse,
    context: HubRequestContext,
    signal: AbortSignal | undefined,
    maxBytes: number,
    tooLarge: () => LlmgwError,
  ): Promise<Buffer> {
    const chunks: Buffer[] = [];
    let total = 0;
    try {
      for await (const chunk of response.body) {
        const buffer = Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk as Uint8Array);
        total += buffer.length;
        if (total > maxBytes) {
          response.body.destroy();
          throw tooLarge();
        }
        chunks.push(buffer);
      }
    } catch (error) {
      if (error instanceof LlmgwError) throw error;
      throw this.#transportError(error, context, response.url, signal);
    }
    return Buffer.concat(chunks);
  }

  async #readJson(response: HubResponse, context: HubRequestContext, signal: AbortSignal | undefined): Promise<unknown> {
    const body = await this.#readBody(
      response,
      context,
      signal,
      MAX_JSON_BYTES,
      () =>
        new UpstreamError(`The registry at ${this.endpoint} sent more than ${MAX_JSON_BYTES} bytes while ${context.what} for '${context.repo}'.`, {
          code: "registry_bad_response",
        }),
    );
    try {
      return JSON.parse(body.toString("utf8")) as unknown;
    } catch (error) {
      throw new UpstreamError(
        `The registry at ${this.endpoint} answered ${context.what} for '${context.repo}' with something that is not JSON; check --registry / HF_ENDPOINT.`,
        {
          code: "registry_bad_response",
          cause: error,
        },
      );
    }
  }

  async #withRetries<T>(attempt: () => Promise<T>, signal: AbortSignal | undefined): Promise<T> {
    for (let n = 0; ; n += 1) {
      try {
        return await attempt();
      } catch (error) {
        const retry = error instanceof LlmgwError && error.retryable && n < this.#retries && signal?.aborted !== true;
        if (!retry) throw error;
        await sleep(backoffDelay(n + 1, { baseMs: this.#retryDelayMs, maxMs: HUB_MAX_RETRY_DELAY_MS }), undefined, signal === undefined ? {} : { signal });
      }
    }
  }

  /** Timeouts, refused and dropped connections: retryable, naming the registry. */
  #transportError(error: unknown, context: HubRequestContext, url: string, signal: AbortSignal | undefined): unknown {
    if (signal?.aborted === true) return signal.reason ?? error;
    if (error instanceof LlmgwError) return error;
    const code = errorCode(error);
    const where = isSameOrigin(url, this.endpoint) ? `The registry at ${this.endpoint}` : `The registry's download host ${new URL(url).origin}`;
    const about = `${context.what} for '${context.repo}'`;
    const timeouts: Record<string, [string, number]> = {
      UND_ERR_CONNECT_TIMEOUT: ["to accept the connection", this.#connectTimeoutMs],
      UND_ERR_HEADERS_TIMEOUT: ["to answer", this.#headersTimeoutMs],
      UND_ERR_BODY_TIMEOUT: ["to send the rest of its answer", this.#bodyTimeoutMs],
    };
    const timeout = code === undefined ? undefined : timeouts[code];
    if (timeout !== undefined) {
      return new UpstreamError(
        `${where} took longer than ${timeout[1]} ms ${timeout[0]} while ${about}. It is retryable: try again later, or check --registry / HF_ENDPOINT.`,
        {
          code: "registry_timeout",
          status: 504,
          retryable: true,
          cause: error,
        },
      );
    }
    return new UpstreamError(
      `${where} could not be reached or dropped the connection while ${about} (${code ?? describeError(error)}). It is retryable: try again later, or check --registry / HF_ENDPOINT.`,
      { code: "registry_unreachable", status: 502, retryable: true, cause: error },
    );
  }

  /** The one mapping of Hub error answers to llmgw errors (hub-errors.ts), with what this client knows. */
  #statusError(response: HubResponse, context: HubRequestContext): Promise<LlmgwError> {
    return hubStatusError(response, context, { endpoint: this.endpoint, hasToken: this.hasToken, inServer: this.#inServer });
  }
}

function parseOrFail<T extends z.ZodType>(schema: T, value: unknown, endpoint: string, context: HubRequestContext): z.output<T> {
  const result = schema.safeParse(value);
  if (result.success) return result.data;
  const issue = result.error.issues[0];
  const where = issue === undefined ? "" : ` (at '${issue.path.map(String).join(".")}': ${issue.message})`;
  throw new UpstreamError(
    `The registry at ${endpoint} answered ${context.what} for '${context.repo}' in an unexpected shape${where}; check that --registry / HF_ENDPOINT points at a Hugging Face Hub API.`,
    { code: "registry_bad_response", cause: result.error },
  );
}

/** The URL of `rel="next"` in a GitHub-style Link header, resolved against the page URL. */
export function nextLink(link: string | undefined, base: string): string | undefined {
  if (link === undefined) return undefined;
  // Each link-value is `<url>` followed by `; param=value` pairs up to the next `<`.
  for (const match of link.matchAll(/<([^>]*)>([^<]*)/g)) {
    const rel = /;\s*rel\s*=\s*(?:"([^"]*)"|([^;,\s]+))/i.exec(match[2] ?? "");
    const rels = (rel?.[1] ?? rel?.[2] ?? "").toLowerCase().split(/\s+/);
    if (rels.includes("next")) return new URL(match[1] ?? "", base).href;
  }
  return undefined;
}

function normaliseGated(value: boolean | string | null | undefined): false | "auto" | "manual" {
  if (value === undefined || value === null || value === false || value === "false") return false;
  return value === "manual" ? "manual" : "auto";
}

function normaliseEtag(value: string | undefined): string | undefined {
  if (value === undefined) return undefined;
  const stripped = value.replace(/^W\//, "").replace(/^"|"$/g, "");
  return stripped === "" ? undefined : stripped;
}

function validRepoId(id: string): boolean {
  try {
    validateRepoName(id);
    return true;
  } catch {
    return false;
  }
}

function nonEmpty(value: string | undefined): string | undefined {
  const trimmed = value?.trim();
  return trimmed === undefined || trimmed === "" ? undefined : trimmed;
}
