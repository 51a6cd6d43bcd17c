// The mirror's file server for nodes, GET|HEAD /mirror/{model}/{version}/{file...}: a
// plain node:http handler that streams from disk with fs read streams (no buffering, no
// web stream conversion), with single byte ranges, a strong ETag (the file's sha256) and
// conditional requests, behind an injected `authorize`. It serves only files the mirror
// vouches for now (`Mirror.check`): one that failed, is gone, or changed on disk since its
// bytes were verified is refused with the reason. Errors leave through src/core/http.ts.
//
// In a cluster a file this server does not hold but another server does is answered with
// a 307 to a running holder (the first by name, so every node's resumes and caches go to
// the same one while it runs), carrying a grant (grants.ts) in place of the key that the
// node's client drops on the cross-origin hop. A request with a valid grant for exactly
// its path is served without `authorize`. When no holder runs, this server fetches the file
// from its origin itself and becomes a holder (origin-copies.ts); meanwhile the answer is a
// retryable 503 that names the holders and says how far that copy got (or why there is
// none), so the node waits and asks again. A request URL holds a grant: only its path is
// ever logged.
import { createReadStream } from "node:fs";
import type { IncomingMessage, ServerResponse } from "node:http";
import { pipeline } from "node:stream/promises";
import { BadRequestError, LlmgwError, NotFoundError, UnavailableError, describeError } from "../core/errors.ts";
import { printable } from "../core/format.ts";
import { methodNotAllowed, sendError } from "../core/http.ts";
import { silentLogger, type Logger } from "../core/log.ts";
import { describeHolders } from "./copy-verdict.ts";
import { GRANT_PARAM } from "./grants.ts";
import { segmentProblem, validateMirrorFile } from "./mirror-paths.ts";
import type { Mirror, MirrorFileCheck } from "./mirror.ts";
import { describeOriginCopy } from "./origin-copies.ts";

/** Where node agents fetch mirrored files. */
export const MIRROR_FILES_PREFIX = "/mirror/";

export interface MirrorFileHandlerOptions {
  /**
   * The mirror; its `cluster` (when it has one) signs the redirects' grants and checks the
   * grants of requests, and `fromOrigin` copies a file no running server holds.
   */
  mirror: Pick<Mirror, "check"> & Partial<Pick<Mirror, "cluster" | "fromOrigin">>;
  /**
   * Checks the caller and throws an LlmgwError (401/403) to refuse. Until nodes have their
   * own credentials the server passes an admin-key check here. Not called for a request
   * that carries a grant (it is checked instead: a bad or expired one is a 403).
   */
  authorize: (req: IncomingMessage) => Promise<void>;
  logger?: Logger;
}

/** True when a request URL is for the mirror's file server. */
export function isMirrorFileRequest(url: string | undefined): boolean {
  return url?.startsWith(MIRROR_FILES_PREFIX) === true;
}

/**
 * The handler for `GET|HEAD /mirror/{model}/{version}/{file...}`. Route requests for which
 * `isMirrorFileRequest(req.url)` holds to it, on the raw node:http server (not through
 * Hono): the body is streamed from disk with backpressure.
 *
 * Answers: 200 (whole file), 206 (one `Range`), 304 (`If-None-Match` matches the ETag),
 * 400 (a bad path segment, named), 401/403 (from `authorize`), 404 (no such complete
 * file, or it failed or is missing on disk, with the reason), 405, 409 (modified on disk
 * since its bytes were verified: not served until they are hashed again), 416 (range
 * outside the file, with `Content-Range: bytes *\/size`). In a cluster also: 307 to a
 * running holder of a file this server does not hold, 403 for a bad or expired grant, and
 * 503 when no holder runs: `mirror_fetching_from_origin` (Retry-After: 2) while this server
 * copies it from its origin, `mirror_holders_down` (Retry-After: 5) when it cannot.
 */
export function createMirrorFileHandler(options: MirrorFileHandlerOptions): (req: IncomingMessage, res: ServerResponse) => Promise<void> {
  const logger = options.logger ?? silentLogger();
  return async (req, res) => {
    try {
      await serveFile(req, res, options);
    } catch (error) {
      // The path only: the query may hold a grant.
      if (!(error instanceof LlmgwError)) logger.error({ err: describeError(error), path: (req.url ?? "").split("?")[0] }, "mirror file server failed");
      // RFC 9110: a 401 names the scheme the client should use.
      if (!res.headersSent && error instanceof LlmgwError && error.status === 401) res.setHeader("www-authenticate", "Bearer");
      sendError(req, res, error);
    }
  };
}

async function serveFile(req: IncomingMessage, res: ServerResponse, options: MirrorFileHandlerOptions): Promise<void> {
  const method = req.method ?? "GET";
  if (method !== "GET" && method !== "HEAD") throw methodNotAllowed(method, "mirror files", "GET or HEAD");
  const grants = options.mirror.cluster?.grants;
  const grant = grantOf(req.url ?? "");
  // A grant is checked for the exact path it names; without a cluster it means nothing and the key is asked for.
  const granted = grant !== null && grants !== undefined;
  if (!granted) await options.authorize(req);
  const { model, version, file } = parseMirrorPath(req.url ?? "");
  if (granted) grants.check(grant, model, version, file);
  const found = await options.mirror.check(model, version, file);
  if (found.kind === "refused") throw found.error;
  if (found.kind === "elsewhere") {
    await sendElsewhere(req, res, { found, model, version, file, granted, options });
    return;
  }
  const etag = `"${found.sha256}"`;
  const headers: Record<string, string> = {
    "accept-ranges": "bytes",
    etag,
    "content-type": "application/octet-stream",
    "last-modified": new Date(found.updatedAt).toUTCString(),
  };
  if (matchesAny(req.headers["if-none-match"], etag)) {
    res.writeHead(304, headers);
    res.end();
    return;
  }
  let start = 0;
  let end = found.size - 1;
  let status = 200;
  const asked = req.headers.range;
  // If-Range: the range applies only to the version of the file the client already has.
  const ifRange = req.headers["if-range"];
  if (asked !== undefined && (typeof ifRange !== "string" || ifRange.trim() === etag)) {
    const range = parseRange(asked, found.size);
    if (range === "unsatisfiable") {
      throw new LlmgwError({
        message: `The range '${printable(asked)}' is outside '${file}' (${found.size} bytes).`,
        code: "range_not_satisfiable",
        status: 416,
        type: "invalid_request_error",
        headers: { "accept-ranges": "bytes", etag, "content-range": `bytes */${found.size}` },
      });
    }
    if (range !== null) {
      ({ start, end } = range);
      status = 206;
      headers["content-range"] = `bytes ${start}-${end}/${found.size}`;
    }
  }
  const length = found.size === 0 ? 0 : end - start + 1;
  headers["content-length"] = String(length);
  res.writeHead(status, headers);
  if (method === "HEAD" || length === 0) {
    res.end();
    return;
  }
  const stream = createReadStream(found.path, { start, end, highWaterMark: 1024 * 1024 });
  try {
    await pipeline(stream, res);
  } catch {
    // The client went away (or the file vanished mid-read); pipeline destroyed both sides.
  }
}

/** The grant in a request URL's query, or null. */
function grantOf(url: string): string | null {
  const query = url.indexOf("?");
  if (query < 0) return null;
  return new URLSearchParams(url.slice(query + 1)).get(GRANT_PARAM);
}

/**
 * A file held by other servers: 304 when the client has it already (its ETag is the row's
 * sha256, the same on every holder), else 307 to the first running holder by name with a
 * fresh grant; 503 when none runs, while this server copies it from its origin (or says
 * why it cannot). A request that came with a grant is not sent on again: the server that
 * signed it believed this one holds the file.
 */
async function sendElsewhere(
  req: IncomingMessage,
  res: ServerResponse,
  where: {
    found: Extract<MirrorFileCheck, { kind: "elsewhere" }>;
    model: string;
    version: string;
    file: string;
    granted: boolean;
    options: MirrorFileHandlerOptions;
  },
): Promise<void> {
  const { found, model, version, file } = where;
  const etag = `"${found.sha256}"`;
  if (matchesAny(req.headers["if-none-match"], etag)) {
    res.writeHead(304, { etag, "accept-ranges": "bytes" });
    res.end();
    return;
  }
  const named = `'${file}' of ${model}/${version}`;
  const grants = where.options.mirror.cluster?.grants;
  if (where.granted || grants === undefined) {
    throw new UnavailableError(
      `This server ('${found.server}') was sent a grant for ${named} but does not hold it now (it is held by ${describeHolders(found.holders)}). Ask the server you first asked again.`,
      { code: "mirror_holder_lost", retryAfterSeconds: 5 },
    );
  }
  const holder = found.holders.find((candidate) => candidate.live && candidate.name !== found.server && candidate.url !== "");
  if (holder === undefined) {
    const copy = (await where.options.mirror.fromOrigin?.(model, version, file)) ?? null;
    const lost = `${named} is not on this server ('${found.server}'), and no server that holds it is running: ${describeHolders(found.holders)}.`;
    if (copy?.state === "fetching")
      throw new UnavailableError(`${lost} ${describeOriginCopy(copy)}`, { code: "mirror_fetching_from_origin", retryAfterSeconds: 2 });
    throw new UnavailableError(
      `${lost} ${copy === null ? "" : `${describeOriginCopy(copy)} `}` +
        `Start one of the holders (this server then redirects to it), or, while one runs, copy the file here with 'llmgw ctl mirror replicate ${model} ${version} --to ${found.server}'.`,
      { code: "mirror_holders_down", retryAfterSeconds: 5 },
    );
  }
  const encoded = [model, version, ...file.split("/")].map(encodeURIComponent).join("/");
  const location = `${holder.url.replace(/\/+$/, "")}${MIRROR_FILES_PREFIX}${encoded}?${GRANT_PARAM}=${grants.sign(model, version, file)}`;
  // Not cached: the location holds a grant that expires.
  res.writeHead(307, { location, etag, "cache-control": "no-store", "content-length": "0" });
  res.end();
}

/**
 * Splits `/mirror/{model}/{version}/{file...}` into its parts, percent-decoding each
 * segment on its own and checking it, so an encoded `/`, `\` or `..` cannot cross a
 * segment boundary. The query string is ignored.
 */
export function parseMirrorPath(url: string): { model: string; version: string; file: string } {
  const pathname = url.split("?")[0] ?? "";
  if (!pathname.startsWith(MIRROR_FILES_PREFIX)) throw new NotFoundError(`Not a mirror path: '${printable(pathname)}'.`, { code: "unknown_endpoint" });
  const raw = pathname.slice(MIRROR_FILES_PREFIX.length).split("/");
  const segments = raw.map((segment, index) => {
    try {
      return decodeURIComponent(segment);
    } catch {
      throw new BadRequestError(`Invalid mirror path: segment ${index + 1} ('${printable(segment)}') is not valid percent-encoding.`, { code: "invalid_path" });
    }
  });
  if (segments.length < 3 || segments.slice(2).join("") === "") {
    if (segments.length >= 1 && segments[0] !== "") validateSegment(segments[0] ?? "", "model");
    if (segments.length >= 2 && segments[1] !== "") validateSegment(segments[1] ?? "", "version");
    throw new NotFoundError(`Mirror paths are /mirror/{model}/{version}/{file}; '${printable(pathname)}' names no file.`, { code: "mirror_file_not_found" });
  }
  const [model = "", version = "", ...fileSegments] = segments;
  validateSegment(model, "model");
  validateSegment(version, "version");
  for (const [index, segment] of fileSegments.entries()) validateSegment(segment, `file segment ${index + 1}`);
  const file = fileSegments.join("/");
  validateMirrorFile(file);
  return { model, version, file };
}

function validateSegment(segment: string, what: string): void {
  const problem = segmentProblem(segment);
  if (problem !== null) {
    throw new BadRequestError(`Invalid mirror path: the ${what} '${printable(segment)}' is not allowed (${problem}). Each path segment must be a plain name.`, {
      code: "invalid_path",
      param: what.startsWith("file") ? "file" : what,
    });
  }
}

/** A single `bytes=a-b`, `bytes=a-` or `bytes=-n`; null for anything else (ignored, the whole file is sent, as RFC 9110 allows). */
export function parseRange(header: string, size: number): { start: number; end: number } | "unsatisfiable" | null {
  const match = /^bytes=(\d*)-(\d*)$/.exec(header.trim());
  if (match === null) return null;
  const [, first = "", last = ""] = match;
  if (first === "" && last === "") return null;
  if (first === "") {
    const suffix = Number(last);
    if (suffix === 0 || size === 0) return "unsatisfiable";
    return { start: Math.max(0, size - suffix), end: size - 1 };
  }
  const start = Number(first);
  if (last !== "" && Number(last) < start) return null;
  if (start >= size) return "unsatisfiable";
  const end = last === "" ? size - 1 : Math.min(Number(last), size - 1);
  return { start, end };
}

/** `If-None-Match`: `*` or a list of entity tags, compared weakly (a `W/` prefix is ignored). */
function matchesAny(header: string | undefined, etag: string): boolean {
  if (header === undefined) return false;
  if (header.trim() === "*") return true;
  return header.split(",").some((candidate) => candidate.trim().replace(/^W\//, "") === etag);
}
