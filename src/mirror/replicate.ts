// Copying mirrored files from another server of the cluster that holds them, so this
// server holds them too (`ctl mirror replicate`, and a fetch of a version another server
// already holds). The bytes come over HTTP from the holder's file server
// (`GET {holder}/mirror/{model}/{version}/{file}?grant=...`, signed here with the cluster
// secret) through the same download machinery as a fetch from the registry
// (file-download.ts): resumed from a partial, hashed as they arrive, compared with the
// sha256 the row says the file must have, fsynced and renamed into place. Only then is
// this server recorded as a holder. The shared row is not changed by a copy, except a
// row that describes this server's own disk, whose stamp becomes the new copy's. The
// downloaders of these copies, and of copies from a file's origin (origin-copies.ts), are
// made here.
import { ConflictError, NotFoundError, UnavailableError, UpstreamError, describeError, type LlmgwError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import { describeHolders } from "./copy-verdict.ts";
import type { Dispatcher } from "undici";
import { headersForRedirect as registryHeadersForRedirect } from "../registry/redirects.ts";
import { createDownloader, type DownloadRows, type FileDownloader, type TransferOptions } from "./file-download.ts";
import { outcome, type ActiveFile, type FetchContext } from "./fetch-input.ts";
import { GRANT_PARAM } from "./grants.ts";
import type { HttpSourceSettings, SourceStatus } from "./http-source.ts";
import type { MirrorCluster } from "./mirror-cluster.ts";
import { origin } from "./mirror-errors.ts";
import { isOwnRow } from "./mirror-holders.ts";
import { fileKey } from "./mirror-paths.ts";
import type { MirrorRow, MirrorRows } from "./mirror-rows.ts";
import type {
  MirrorFetchFile,
  MirrorFileCheck,
  MirrorFileOutcome,
  MirrorIo,
  MirrorProgressEvent,
  ReplicateFileOutcome,
  ReplicateFilePlan,
  ReplicateOptions,
  ReplicateSummary,
} from "./mirror-types.ts";
import { verifiedSha256 } from "./verification.ts";

/** How many times a copy that made progress is continued with a fresh grant after its grant was refused (it outlived it). */
const GRANT_ROUNDS = 5;

export interface CopyDeps {
  cluster: MirrorCluster;
  /** A downloader whose rows are `holderRows` (it never writes the shared row's progress). */
  downloader: FileDownloader;
  finalPath: (model: string, version: string, file: string) => string;
  logger: Logger;
}

export interface ReplicateDeps extends CopyDeps {
  rows: MirrorRows;
  check: (model: string, version: string, file: string) => Promise<MirrorFileCheck>;
  /** Runs one file's copy in that file's lane, with a download slot. */
  run: <T>(key: string, task: () => Promise<T>) => Promise<T>;
}

/**
 * What a copy records: nothing while it runs (the shared row describes the fetch, not this
 * copy), and once the bytes matched, this server as a holder; a row that describes this
 * server's own disk gets the new copy's stamp.
 */
export function holderRows(rows: MirrorRows): DownloadRows {
  return {
    upsert: async (source, spec, fields) => {
      const sha256 = spec.sha256 ?? fields.actual_sha256;
      if (fields.state !== "complete" || fields.verified === undefined || fields.verified === null || sha256 === null) return;
      const ref = { model: source.model, version: source.version, file: spec.path };
      const row = await rows.get(ref.model, ref.version, ref.file);
      if (row === undefined) return; // Deleted meanwhile: nothing to hold.
      if (isOwnRow(row, rows.self)) await rows.markVerified(ref, sha256, fields.verified);
      else await rows.recordHeld(ref, sha256, fields.verified.size);
    },
    recordProgress: async () => undefined,
  };
}

/**
 * The downloaders of a cluster's copies, sharing the mirror's dispatcher; both record this
 * server as a holder and never touch the shared row's progress (`holderRows`). `copier`
 * copies from another holder: no Authorization goes there, the grant in the URL is the
 * credential. `originCopier` copies from the file's origin (origin-copies.ts), with the
 * registry's rule for headers across redirects (its token is dropped on another host).
 */
export function clusterDownloaders(
  options: TransferOptions & { dispatcher: Dispatcher; headersForRedirect?: HttpSourceSettings["headersForRedirect"] | undefined },
  parts: { rows: MirrorRows; io: MirrorIo; logger: Logger; clock: () => number },
): { copier: FileDownloader; originCopier: FileDownloader } {
  const shared = { rows: holderRows(parts.rows), io: parts.io, logger: parts.logger, clock: parts.clock };
  return {
    copier: createDownloader(options, { ...shared, http: { headersForRedirect: (headers) => headers, statusError: holderStatusError } }).downloader,
    originCopier: createDownloader(options, { ...shared, http: { headersForRedirect: options.headersForRedirect ?? registryHeadersForRedirect } }).downloader,
  };
}

/** How a holder's refusal is named: it is another llmgw server, not a registry. */
export function holderStatusError(answer: SourceStatus): LlmgwError | null {
  const where = origin(answer.url);
  const said = answer.said === undefined ? "" : ` It said: ${answer.said}`;
  if (answer.status === 401 || answer.status === 403) {
    return new UpstreamError(
      `The server at ${where} refused the grant for '${answer.spec.path}' (${answer.status}).${said} If it happens again, the servers do not share one cluster secret: give them the same --cluster-secret-file.`,
      { code: "mirror_grant_refused" },
    );
  }
  if (answer.status === 404 || answer.status === 409) {
    return new UpstreamError(
      `The server at ${where} no longer serves '${answer.spec.path}' (${answer.status}).${said} Copy it from another holder ('llmgw ctl mirror list' shows them).`,
      {
        code: "mirror_holder_lost",
      },
    );
  }
  return null;
}

/** Copies one file from `from` into this server's mirror and records it held; failures are returned, not thrown (except the abort). */
export async function copyFile(
  deps: CopyDeps,
  input: {
    row: MirrorRow;
    sha256: string;
    from: { name: string; url: string };
    signal: AbortSignal;
    onProgress?: ((event: MirrorProgressEvent) => void) | undefined;
  },
): Promise<ReplicateFileOutcome> {
  const { row, from } = input;
  const final = deps.finalPath(row.model, row.version, row.file);
  const context: FetchContext = {
    model: row.model,
    version: row.version,
    repo: row.repo,
    revision: row.revision,
    signal: input.signal,
    onProgress: input.onProgress,
  };
  const path = [row.model, row.version, ...row.file.split("/")].map(encodeURIComponent).join("/");
  let copied = 0;
  for (let round = 1; ; round += 1) {
    const grant = deps.cluster.grants.sign(row.model, row.version, row.file);
    const spec = {
      path: row.file,
      url: `${from.url.replace(/\/+$/, "")}/mirror/${path}?${GRANT_PARAM}=${grant}`,
      sha256: input.sha256,
      size: row.bytes_total,
      headers: {},
    };
    const active: ActiveFile = { state: "pending", bytesDone: 0, bytesTotal: row.bytes_total };
    const outcome = await deps.downloader.download(context, spec, { final, active, reuseFinal: false });
    copied += outcome.bytesFetched;
    const result = { file: row.file, from: from.name, bytesCopied: copied, bytesTotal: row.bytes_total };
    if (outcome.state === "complete") {
      deps.logger.info({ model: row.model, version: row.version, file: row.file, from: from.name, bytes: copied }, "mirror file copied from another server");
      return { ...result, state: "copied", error: null };
    }
    // A copy that outlived its grant goes on from the bytes on disk with a fresh one.
    if (outcome.error?.code === "mirror_grant_refused" && outcome.bytesFetched > 0 && round < GRANT_ROUNDS) continue;
    return { ...result, state: "failed", error: outcome.error };
  }
}

/**
 * In a cluster, a file of a fetch that is complete (same revision and sha256) is skipped
 * when this server holds it, and copied from another running server that holds it rather
 * than fetched again from the source: a fetch from the source would take the shared row
 * back to `pending` while it runs, and the servers holding it would stop serving it. Null
 * when neither applies (or the copy failed: the fetch from the source goes on).
 */
export async function skipOrCopyFromHolder(
  deps: CopyDeps,
  input: {
    context: FetchContext;
    spec: MirrorFetchFile;
    row: MirrorRow;
    check: (model: string, version: string, file: string) => Promise<MirrorFileCheck>;
    /** Runs the copy with a download slot. */
    slot: <T>(task: () => Promise<T>) => Promise<T>;
  },
): Promise<MirrorFileOutcome | null> {
  const { context, spec, row } = input;
  const sha256 = verifiedSha256(row);
  if (sha256 === null || row.state !== "complete" || row.revision !== context.revision || row.sha256 !== spec.sha256) return null;
  if (spec.size !== null && row.bytes_total !== spec.size) return null;
  const checked = await input.check(row.model, row.version, row.file);
  if (checked.kind === "ok") return outcome(spec, { state: "complete", skipped: true, bytesTotal: row.bytes_total, sha256 });
  const from = checked.kind === "elsewhere" ? checked.holders.find((holder) => holder.live && holder.url !== "") : undefined;
  if (from === undefined) return null;
  const copy = await input.slot(() => copyFile(deps, { row, sha256, from, signal: context.signal, onProgress: context.onProgress }));
  if (copy.state === "copied") return outcome(spec, { state: "complete", bytesFetched: copy.bytesCopied, bytesTotal: row.bytes_total, sha256 });
  deps.logger.warn(
    { model: row.model, version: row.version, file: row.file, from: from.name, err: copy.error?.message },
    "could not copy a mirror file from another server; fetching it from its source",
  );
  return null;
}

/**
 * Copies every complete file of a version that this server does not hold from a live
 * holder (the first by name). Refused before anything is copied when the version is not
 * complete, when a file is held by no running server, or when nobody holds it.
 */
export async function replicateVersion(
  deps: ReplicateDeps,
  model: string,
  version: string,
  options: ReplicateOptions & { signal: AbortSignal },
): Promise<ReplicateSummary> {
  const self = deps.cluster.self;
  const rows = await deps.rows.list({ model, version });
  if (rows.length === 0)
    throw new NotFoundError(`The mirror has no version ${model}/${version}. GET /api/v1/mirror lists what it holds.`, { code: "mirror_version_not_found" });
  const incomplete = rows.filter((row) => row.state !== "complete" || verifiedSha256(row) === null);
  if (incomplete.length > 0) {
    throw new ConflictError(
      `Version ${model}/${version} is not complete: ${incomplete.map((row) => `'${row.file}' is ${row.state}${row.fetched_by === null ? "" : ` (on server '${row.fetched_by}')`}`).join(", ")}. ` +
        `Wait until 'llmgw ctl mirror list --model ${model}' shows it complete (or fetch it again), then replicate.`,
      { code: "mirror_version_incomplete" },
    );
  }
  const plan: Array<ReplicateFilePlan & { row: MirrorRow; sha256: string; url: string }> = [];
  const down: string[] = [];
  const lost: string[] = [];
  for (const row of rows) {
    const checked = await deps.check(model, version, row.file);
    const base = { file: row.file, bytesTotal: row.bytes_total, row, sha256: verifiedSha256(row) as string };
    if (checked.kind === "ok") plan.push({ ...base, from: null, url: "" });
    else if (checked.kind === "refused") lost.push(`'${row.file}': ${describeError(checked.error)}`);
    else {
      const live = checked.holders.find((holder) => holder.live && holder.name !== self && holder.url !== "");
      if (live === undefined) down.push(`'${row.file}' (held by ${describeHolders(checked.holders)})`);
      else plan.push({ ...base, from: live.name, url: live.url });
    }
  }
  if (lost.length > 0) {
    throw new ConflictError(
      `Cannot replicate ${model}/${version} to '${self}': no server holds verified bytes of ${lost.join("; ")}. Fetch the version again.`,
      { code: "mirror_replicate_no_holder" },
    );
  }
  if (down.length > 0) {
    throw new UnavailableError(
      `Cannot replicate ${model}/${version} to '${self}': no running server holds ${down.join(", ")}. Start a server that holds it, then replicate again.`,
      { code: "mirror_holders_down", retryAfterSeconds: 5 },
    );
  }
  options.onStart?.(plan.map(({ file, bytesTotal, from }) => ({ file, bytesTotal, from })));
  const files = await Promise.all(
    plan.map((entry): Promise<ReplicateFileOutcome> => {
      if (entry.from === null)
        return Promise.resolve({ file: entry.file, state: "held", from: null, bytesCopied: 0, bytesTotal: entry.bytesTotal, error: null });
      const from = { name: entry.from, url: entry.url };
      return deps.run(fileKey(model, version, entry.file), () =>
        copyFile(deps, { row: entry.row, sha256: entry.sha256, from, signal: options.signal, onProgress: options.onProgress }),
      );
    }),
  );
  options.signal.throwIfAborted();
  return {
    model,
    version,
    server: self,
    complete: files.every((file) => file.state !== "failed"),
    files,
    copied: files.filter((file) => file.state === "copied").length,
    alreadyHeld: files.filter((file) => file.state === "held").length,
    failed: files.filter((file) => file.state === "failed").length,
    bytesCopied: files.reduce((sum, file) => sum + file.bytesCopied, 0),
  };
}
