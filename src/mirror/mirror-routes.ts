// The mirror's HTTP surface, in two parts:
//
// - Admin routes under /api/v1/mirror (mounted by the admin API behind its admin-key
//   middleware): list files with state and progress plus disk use, start mirroring a
//   repository (answered 202; the fetch runs in the background and GET shows progress),
//   and delete a version.
// - The file server for nodes, GET|HEAD /mirror/{model}/{version}/{file...}: a plain
//   node:http handler that streams from disk with fs read streams (no buffering, no web
//   stream conversion), with single byte ranges, a strong ETag (the file's sha256) and
//   conditional requests, behind an injected `authorize`.
import { createReadStream } from "node:fs";
import type { IncomingMessage, ServerResponse } from "node:http";
import { pipeline } from "node:stream/promises";
import type { Hono } from "hono";
import { z } from "zod";
import { BadRequestError, LlmgwError, NotFoundError, describeError, parseWith, renderError } from "../core/errors.ts";
import { printable } from "../core/format.ts";
import { parseJsonBody } from "../core/json-body.ts";
import { silentLogger, type Logger } from "../core/log.ts";
import type { Principal } from "../keys/key-service.ts";
import { chooseArtifact, classifyFiles } from "../registry/file-sets.ts";
import { assertLocalFilesReadable, isLocalSource, listLocalSource } from "../registry/local-source.ts";
import type { Registry } from "../registry/types.ts";
import { validateMirrorFile, validateMirrorKey, segmentProblem } from "./mirror-paths.ts";
import { defaultMirrorModelName, planLocalMirrorFetch, planMirrorFetch, type MirrorFetchPlan } from "./mirror-plan.ts";
import type { Mirror } from "./mirror.ts";

/** The admin API's context variables: its middleware sets the verified principal. */
export type MirrorRoutesEnv = { Variables: { principal: Principal } };

export interface MirrorRoutesOptions {
  mirror: Mirror;
  /** Reads Hub repositories (a HubClient). */
  registry: Registry;
  logger?: Logger;
  /** Base of relative local paths. Default: the server's working directory. */
  cwd?: string;
}

const startSchema = z
  .object({
    repo: z.string().min(1),
    revision: z.string().min(1).optional(),
    quant: z.string().min(1).optional(),
    file: z.string().min(1).optional(),
    format: z.enum(["gguf", "safetensors"]).optional(),
    projector: z.union([z.boolean(), z.string().min(1)]).optional(),
    /** The mirror's name for the model; default `owner--name`. */
    model: z.string().min(1).optional(),
  })
  .strict();

/**
 * Adds the mirror's admin routes to the admin API app. Mount after the admin-key
 * middleware (it reads `c.get("principal")` for the log); errors are thrown as llmgw
 * errors for the app's `onError` to render.
 *
 * - `GET /api/v1/mirror[?model=m]` → `{data: MirrorFileView[], versions: [...], disk}`
 * - `POST /api/v1/mirror` `{repo, revision?, quant?, file?, format?, projector?, model?}` →
 *   202 `{model, version, repo, revision, files, totalBytes, progress}`
 * - `DELETE /api/v1/mirror/:model/:version` → `{deleted: {model, version, files, bytes}}`
 */
export function mountMirrorRoutes(app: Hono<MirrorRoutesEnv>, options: MirrorRoutesOptions): void {
  const { mirror } = options;
  const logger = options.logger ?? silentLogger();

  app.get("/api/v1/mirror", async (c) => {
    const model = c.req.query("model");
    const files = await mirror.list(model === undefined || model === "" ? {} : { model });
    const disk = await mirror.diskUsage();
    return c.json({ data: files, versions: summarizeVersions(files), disk });
  });

  app.post("/api/v1/mirror", async (c) => {
    const body = parseWith(startSchema, parseJsonBody(await c.req.text()));
    // Reading the repository stops when the client goes away; the fetch itself does not.
    const signal = c.req.raw.signal;
    const choice = { quant: body.quant, file: body.file, format: body.format, projector: body.projector };
    let plan: MirrorFetchPlan;
    let setName: string;
    if (isLocalSource(body.repo)) {
      // Listed, not hashed: the mirror hashes the chosen files while it copies them.
      const listing = await listLocalSource({ source: body.repo, signal, ...(options.cwd === undefined ? {} : { cwd: options.cwd }) });
      const chosen = chooseArtifact({ sets: classifyFiles(listing.files), ...choice });
      await assertLocalFilesReadable(chosen.files, signal);
      plan = planLocalMirrorFetch({ listing, chosen });
      setName = chosen.set.name;
    } else {
      const info = await options.registry.repoInfo({ repo: body.repo, signal, ...(body.revision === undefined ? {} : { revision: body.revision }) });
      const chosen = chooseArtifact({ sets: classifyFiles(info.files), ...choice });
      plan = planMirrorFetch({ registry: options.registry, repoInfo: info, chosen });
      setName = chosen.set.name;
    }
    const model = validateMirrorKey("model", body.model ?? defaultMirrorModelName(plan.repo));
    const fetch = { model, version: plan.version, repo: plan.repo, revision: plan.revision, files: plan.files };
    // Everything fetchVersion would refuse is refused here, before the 202: a fetch that is
    // accepted always gets its rows, so `ctl mirror fetch` has something to follow.
    mirror.checkFetch(fetch);
    const actor = `${c.get("principal").role}:${c.get("principal").name}`;
    logger.info({ actor, model, version: plan.version, repo: plan.repo, files: plan.files.length, bytes: plan.totalBytes }, "mirror fetch requested");
    // The fetch outlives this request: its progress and outcome are in the rows (GET), and
    // Mirror.close() stops it when the server stops.
    mirror.fetchVersion(fetch).then(
      (summary) =>
        logger.info({ model, version: plan.version, complete: summary.complete, fetched: summary.fetched, skipped: summary.skipped, failed: summary.failed }, "mirror fetch finished"),
      (error: unknown) => logger.warn({ model, version: plan.version, err: describeError(error) }, "mirror fetch stopped"),
    );
    return c.json(
      {
        model,
        version: plan.version,
        repo: plan.repo,
        revision: plan.revision,
        set: setName,
        files: plan.files.map((file) => ({ path: file.path, size: file.size, sha256: file.sha256 })),
        totalBytes: plan.totalBytes,
        progress: `/api/v1/mirror?model=${encodeURIComponent(model)}`,
      },
      202,
    );
  });

  app.delete("/api/v1/mirror/:model/:version", async (c) => {
    const deleted = await mirror.deleteVersion(c.req.param("model"), c.req.param("version"));
    logger.info({ actor: `${c.get("principal").role}:${c.get("principal").name}`, ...deleted }, "mirror version deleted by request");
    return c.json({ deleted });
  });
}

type MirrorFileList = Awaited<ReturnType<Mirror["list"]>>;

/** One line per version: how many files, how many complete, bytes done of total, and an overall state. */
function summarizeVersions(files: MirrorFileList) {
  const versions = new Map<string, { model: string; version: string; repo: string; revision: string; files: number; complete: number; failed: number; bytesDone: number; bytesTotal: number; state: string }>();
  for (const file of files) {
    const key = `${file.model}\u0000${file.version}`;
    const entry = versions.get(key) ?? { model: file.model, version: file.version, repo: file.repo, revision: file.revision, files: 0, complete: 0, failed: 0, bytesDone: 0, bytesTotal: 0, state: "" };
    entry.files += 1;
    if (file.state === "complete") entry.complete += 1;
    if (file.state === "failed") entry.failed += 1;
    entry.bytesDone += file.bytesDone;
    entry.bytesTotal += file.bytesTotal ?? 0;
    versions.set(key, entry);
  }
  return [...versions.values()].map((entry) => ({
    ...entry,
    state: entry.complete === entry.files ? "complete" : entry.failed > 0 ? "failed" : files.some((f) => f.model === entry.model && f.version === entry.version && f.active) ? "fetching" : "pending",
  }));
}


// ---------------------------------------------------------------------------------------

/** Where node agents fetch mirrored files. */
export const MIRROR_FILES_PREFIX = "/mirror/";

export interface MirrorFileHandlerOptions {
  mirror: Pick<Mirror, "lookup">;
  /**
   * Checks the caller and throws an LlmgwError (401/403) to refuse. Until nodes have their
   * own credentials the server passes an admin-key check here.
   */
  authorize: (req: IncomingMessage) => Promise<void>;
  logger?: Logger;
}

/** True when a request URL is for the mirror's file server. */
export function isMirrorFileRequest(url: string | undefined): boolean {
  return url !== undefined && url.startsWith(MIRROR_FILES_PREFIX);
}

/**
 * The handler for `GET|HEAD /mirror/{model}/{version}/{file...}`. Route requests for which
 * `isMirrorFileRequest(req.url)` holds to it, on the raw node:http server (not through
 * Hono): the body is streamed from disk with backpressure.
 *
 * Answers: 200 (whole file), 206 (one `Range`), 304 (`If-None-Match` matches the ETag),
 * 400 (a bad path segment, named), 401/403 (from `authorize`), 404 (no such complete
 * file), 405, 416 (range outside the file, with `Content-Range: bytes *\/size`).
 */
export function createMirrorFileHandler(options: MirrorFileHandlerOptions): (req: IncomingMessage, res: ServerResponse) => Promise<void> {
  const logger = options.logger ?? silentLogger();
  return async (req, res) => {
    try {
      await serveFile(req, res, options);
    } catch (error) {
      if (!(error instanceof LlmgwError)) logger.error({ err: describeError(error), url: req.url }, "mirror file server failed");
      if (res.headersSent) {
        res.destroy();
        return;
      }
      const rendered = renderError(error);
      const body = JSON.stringify(rendered.body);
      res.writeHead(rendered.status, {
        ...rendered.headers,
        "content-type": "application/json; charset=utf-8",
        "content-length": String(Buffer.byteLength(body)),
        ...(rendered.status === 401 ? { "www-authenticate": "Bearer" } : {}),
      });
      res.end(req.method === "HEAD" ? undefined : body);
    }
  };
}

async function serveFile(req: IncomingMessage, res: ServerResponse, options: MirrorFileHandlerOptions): Promise<void> {
  const method = req.method ?? "GET";
  if (method !== "GET" && method !== "HEAD") {
    throw new LlmgwError({ message: `${method} is not supported on mirror files; use GET or HEAD.`, code: "method_not_allowed", status: 405, headers: { allow: "GET, HEAD" } });
  }
  await options.authorize(req);
  const { model, version, file } = parseMirrorPath(req.url ?? "");
  const found = await options.mirror.lookup(model, version, file);
  if (found === null) {
    throw new NotFoundError(`The mirror has no complete file '${file}' in ${model}/${version}. It may still be fetching or have failed: GET /api/v1/mirror shows its state.`, {
      code: "mirror_file_not_found",
    });
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
      const body = JSON.stringify(
        renderError(
          new LlmgwError({
            message: `The range '${printable(asked)}' is outside '${file}' (${found.size} bytes).`,
            code: "range_not_satisfiable",
            status: 416,
            type: "invalid_request_error",
          }),
        ).body,
      );
      res.writeHead(416, { ...headers, "content-range": `bytes */${found.size}`, "content-type": "application/json; charset=utf-8", "content-length": String(Buffer.byteLength(body)) });
      res.end(method === "HEAD" ? undefined : body);
      return;
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
  fileSegments.forEach((segment, index) => validateSegment(segment, `file segment ${index + 1}`));
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
