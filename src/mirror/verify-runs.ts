// Verifications started over the admin API (`POST /api/v1/mirror/verify`): re-hashing a
// version can take minutes, longer than a client should hold a request open, so each runs
// in the background and `GET /api/v1/mirror/verify/{id}` shows its progress and the result
// of each file, the way a fetch is followed through `GET /api/v1/mirror`. Runs live in
// memory (the last few are kept); their results are in the rows and the audit trail.
import { randomUUID } from "node:crypto";
import { NotFoundError, describeError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import type { Mirror } from "./mirror.ts";
import type { VerifyFileResult } from "./mirror-types.ts";

export interface VerifyRunFile {
  model: string;
  version: string;
  file: string;
  bytesTotal: number | null;
  /** `pending` until its turn, `hashing` while read, then the result. */
  result: "pending" | "hashing" | VerifyFileResult["result"];
  /** Bytes hashed so far. */
  bytesDone: number;
  expectedSha256: string | null;
  actualSha256: string | null;
  message: string | null;
}

export interface VerifyRunView {
  id: string;
  /** `running`, `done` (every file has a result), or `stopped` (the server stopped it; see `error`). */
  state: "running" | "done" | "stopped";
  model: string | null;
  version: string | null;
  startedAt: string;
  finishedAt: string | null;
  totalBytes: number;
  ok: number;
  failed: number;
  skipped: number;
  files: VerifyRunFile[];
  error: string | null;
}

/** Finished runs kept for GET; the oldest go first. */
const KEEP_FINISHED = 20;

export class VerifyRuns {
  readonly #mirror: Pick<Mirror, "verify" | "audit">;
  readonly #logger: Logger;
  readonly #runs = new Map<string, VerifyRunView>();

  constructor(options: { mirror: Pick<Mirror, "verify" | "audit">; logger: Logger }) {
    this.#mirror = options.mirror;
    this.#logger = options.logger;
  }

  /**
   * Starts a verification of the files in scope and resolves with its run once the files
   * are known (so a scope with nothing in it is refused, not accepted). When it ends, a
   * `mirror.verify` audit entry records the actor and the counts.
   */
  start(scope: { model?: string | undefined; version?: string | undefined; actor: string }): Promise<VerifyRunView> {
    const { model, version, actor } = scope;
    return new Promise<VerifyRunView>((resolve, reject) => {
      let run: VerifyRunView | undefined;
      const files = new Map<string, VerifyRunFile>();
      const fileOf = (event: { model: string; version: string; file: string }) => files.get(`${event.model}/${event.version}/${event.file}`);
      const verifying = this.#mirror.verify({
        ...(model === undefined ? {} : { model }),
        ...(version === undefined ? {} : { version }),
        onStart: (listed) => {
          run = {
            id: randomUUID(),
            state: "running",
            model: model ?? null,
            version: version ?? null,
            startedAt: new Date().toISOString(),
            finishedAt: null,
            totalBytes: listed.reduce((sum, f) => sum + (f.bytesTotal ?? 0), 0),
            ok: 0,
            failed: 0,
            skipped: 0,
            files: listed.map((f) => ({ ...f, result: "pending", bytesDone: 0, expectedSha256: null, actualSha256: null, message: null })),
            error: null,
          };
          for (const file of run.files) files.set(`${file.model}/${file.version}/${file.file}`, file);
          this.#keep(run);
          resolve(run);
        },
        onProgress: (event) => {
          const file = fileOf(event);
          if (file === undefined) return;
          file.result = "hashing";
          file.bytesDone = event.bytesDone;
        },
        onFile: (result) => {
          const file = fileOf(result);
          if (file === undefined || run === undefined) return;
          Object.assign(file, { result: result.result, expectedSha256: result.expectedSha256, actualSha256: result.actualSha256, message: result.message });
          if (result.actualSha256 !== null) file.bytesDone = result.bytes ?? file.bytesDone;
          run[result.result] += 1;
        },
      });
      verifying.then(
        // The audit entry is written before the run says it ended, so whoever saw it end finds the entry.
        async (summary) => {
          if (run === undefined) return;
          await this.#audit(actor, run, { ok: summary.ok, failed: summary.failed, skipped: summary.skipped, bytes: summary.bytesHashed });
          run.finishedAt = new Date().toISOString();
          run.state = "done";
        },
        async (error: unknown) => {
          if (run === undefined) {
            reject(error);
            return;
          }
          await this.#audit(actor, run, { ok: run.ok, failed: run.failed, skipped: run.skipped, stopped: describeError(error) });
          run.finishedAt = new Date().toISOString();
          run.error = `The verification stopped before it was done: ${describeError(error)}. Run it again.`;
          run.state = "stopped";
        },
      );
    });
  }

  get(id: string): VerifyRunView {
    const run = this.#runs.get(id);
    if (run === undefined) {
      throw new NotFoundError(
        `No verification '${id}' is known here (the server keeps the last ${KEEP_FINISHED} and forgets them when it restarts); start one with POST /api/v1/mirror/verify.`,
        {
          code: "mirror_verification_not_found",
        },
      );
    }
    return run;
  }

  #keep(run: VerifyRunView): void {
    this.#runs.set(run.id, run);
    const finished = [...this.#runs.values()].filter((r) => r.state !== "running");
    for (const old of finished.slice(0, Math.max(0, finished.length - KEEP_FINISHED))) this.#runs.delete(old.id);
  }

  async #audit(actor: string, run: VerifyRunView, detail: Record<string, unknown>): Promise<void> {
    const target = run.model === null ? "mirror" : run.version === null ? run.model : `${run.model}/${run.version}`;
    await this.#mirror
      .audit({ actor, action: "mirror.verify", target, detail })
      .catch((error: unknown) => this.#logger.warn({ err: describeError(error), target }, "could not record a mirror verification in the audit log"));
  }
}
