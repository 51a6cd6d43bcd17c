// Replications started over the admin API (`POST /api/v1/mirror/replicate`) on this
// server: copying a version can take minutes, longer than a client holds a request open,
// so each runs in the background and `GET /api/v1/mirror/replicate/{model}/{version}`
// shows its progress and the result of each file, as a verification is followed. One run
// per version at a time: asking again while one runs joins it. Runs live in memory (the
// last per version); what was copied is in the holder rows, and each run ends with a
// `mirror.replicate` audit entry.
import { NotFoundError, describeError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import type { Mirror } from "./mirror.ts";
import type { ReplicateSummary } from "./mirror-types.ts";

export interface ReplicateRunFile {
  file: string;
  /** The server it is copied from; null when this server held it already. */
  from: string | null;
  state: "held" | "pending" | "copying" | "copied" | "failed";
  bytesDone: number;
  bytesTotal: number | null;
  error: string | null;
}

export interface ReplicateRunView {
  /** The server that copies (the one the run is on). */
  server: string;
  model: string;
  version: string;
  /** `running`; `done` (every file held here now); `failed` (a file failed, or the run stopped: see the files and `error`). */
  state: "running" | "done" | "failed";
  startedAt: string;
  finishedAt: string | null;
  /** Bytes to copy (files already held not counted) and bytes copied so far. */
  totalBytes: number;
  bytesDone: number;
  copied: number;
  alreadyHeld: number;
  failed: number;
  files: ReplicateRunFile[];
  error: string | null;
}

/** Versions whose last run is kept; the oldest finished go first. */
const KEEP_VERSIONS = 50;

export class ReplicateRuns {
  readonly #mirror: Pick<Mirror, "replicate" | "audit">;
  readonly #server: string;
  readonly #logger: Logger;
  readonly #runs = new Map<string, ReplicateRunView>();

  constructor(options: { mirror: Pick<Mirror, "replicate" | "audit">; server: string; logger: Logger }) {
    this.#mirror = options.mirror;
    this.#server = options.server;
    this.#logger = options.logger;
  }

  /**
   * Starts copying a version here and resolves with its run once the files and their
   * sources are known (a replication that cannot start is refused, not accepted), or with
   * the run already going for that version.
   */
  start(scope: { model: string; version: string; actor: string }): Promise<ReplicateRunView> {
    const { model, version, actor } = scope;
    const key = `${model}/${version}`;
    const running = this.#runs.get(key);
    if (running?.state === "running") return Promise.resolve(running);
    return new Promise<ReplicateRunView>((resolve, reject) => {
      let run: ReplicateRunView | undefined;
      const copying = this.#mirror.replicate(model, version, {
        onStart: (plan) => {
          run = {
            server: this.#server,
            model,
            version,
            state: "running",
            startedAt: new Date().toISOString(),
            finishedAt: null,
            totalBytes: plan.reduce((sum, f) => sum + (f.from === null ? 0 : (f.bytesTotal ?? 0)), 0),
            bytesDone: 0,
            copied: 0,
            alreadyHeld: plan.filter((f) => f.from === null).length,
            failed: 0,
            files: plan.map((f) => ({
              file: f.file,
              from: f.from,
              state: f.from === null ? "held" : "pending",
              bytesDone: 0,
              bytesTotal: f.bytesTotal,
              error: null,
            })),
            error: null,
          };
          this.#keep(key, run);
          resolve(run);
        },
        onProgress: (event) => {
          const file = run?.files.find((f) => f.file === event.file);
          if (run === undefined || file === undefined || (file.state !== "pending" && file.state !== "copying")) return;
          file.state = "copying";
          file.bytesDone = event.bytesDone;
          run.bytesDone = run.files.reduce((sum, f) => sum + (f.from === null ? 0 : f.bytesDone), 0);
        },
      });
      copying.then(
        // The audit entry is written before the run says it ended, so whoever saw it end finds the entry.
        async (summary) => {
          if (run === undefined) return;
          record(run, summary);
          await this.#audit(actor, run, { copied: summary.copied, already_held: summary.alreadyHeld, failed: summary.failed, bytes: summary.bytesCopied });
          run.finishedAt = new Date().toISOString();
          run.state = summary.complete ? "done" : "failed";
        },
        async (error: unknown) => {
          if (run === undefined) {
            reject(error);
            return;
          }
          await this.#audit(actor, run, { copied: run.copied, failed: run.failed, stopped: describeError(error) });
          run.finishedAt = new Date().toISOString();
          run.error = `The replication stopped before it was done: ${describeError(error)}. Run it again: copies resume from the bytes already on disk.`;
          run.state = "failed";
        },
      );
    });
  }

  /** The last run of a version on this server. */
  get(model: string, version: string): ReplicateRunView {
    const run = this.#runs.get(`${model}/${version}`);
    if (run === undefined) {
      throw new NotFoundError(
        `No replication of ${model}/${version} has run on server '${this.#server}' since it started; start one with 'llmgw ctl mirror replicate ${model} ${version} --to ${this.#server}'.`,
        { code: "mirror_replication_not_found" },
      );
    }
    return run;
  }

  #keep(key: string, run: ReplicateRunView): void {
    this.#runs.delete(key);
    this.#runs.set(key, run);
    const finished = [...this.#runs.entries()].filter(([, r]) => r.state !== "running");
    for (const [old] of finished.slice(0, Math.max(0, this.#runs.size - KEEP_VERSIONS))) this.#runs.delete(old);
  }

  async #audit(actor: string, run: ReplicateRunView, detail: Record<string, unknown>): Promise<void> {
    const target = `${run.model}/${run.version}`;
    const from = [...new Set(run.files.map((f) => f.from).filter((name): name is string => name !== null))];
    await this.#mirror
      .audit({ actor, action: "mirror.replicate", target, detail: { server: run.server, from, ...detail } })
      .catch((error: unknown) => this.#logger.warn({ err: describeError(error), target }, "could not record a mirror replication in the audit log"));
  }
}

function record(run: ReplicateRunView, summary: ReplicateSummary): void {
  for (const outcome of summary.files) {
    const file = run.files.find((f) => f.file === outcome.file);
    if (file === undefined) continue;
    file.state = outcome.state;
    file.error = outcome.error?.message ?? null;
    if (outcome.state === "copied") file.bytesDone = outcome.bytesTotal ?? outcome.bytesCopied;
  }
  run.copied = summary.copied;
  run.alreadyHeld = summary.alreadyHeld;
  run.failed = summary.failed;
  run.bytesDone = run.files.reduce((sum, f) => sum + (f.from === null ? 0 : f.bytesDone), 0);
}
