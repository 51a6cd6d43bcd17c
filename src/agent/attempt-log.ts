// What an attempt leaves in its run folder for whoever reads a failure later: the engine's
// own output in `attempt-N.log` (stdout and stderr, created exclusively per attempt), and
// one JSON line per attempt in `attempts.jsonl` ({attempt, settings, result, log, error,
// at}). The record is written fire-and-forget, in order, so a full disk or an unwritable
// file never blocks a start or a stop (DESIGN.md "Engine supervision"); it is only logged.
// The last lines of an attempt log become part of the failure's message.
import { appendFile, open, type FileHandle } from "node:fs/promises";
import { join } from "node:path";
import { describeError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import type { EngineLaunch } from "./supervisor-options.ts";

const SECRET_FLAG = /key|token|secret|password/i;
const LOG_TAIL_BYTES = 8192;
const LOG_TAIL_LINES = 20;

export interface AttemptRecord {
  attempt: number;
  /** What the attempt ran with (EngineLaunch.settings, or the redacted command line); null before prepare. */
  settings: unknown;
  /** "ready", "stopped", or the failure code. */
  result: string;
  /** The attempt log's name within the run folder; null when nothing was spawned. */
  log: string | null;
  error?: string;
}

/** Appends attempt records to `attempts.jsonl`, one after another, never failing the caller. */
export class AttemptRecorder {
  private written: Promise<void> = Promise.resolve();

  constructor(private readonly log: Logger) {}

  /** Queues one line for `<runFolder>/attempts.jsonl` and returns at once. */
  append(runFolder: string, record: AttemptRecord): void {
    const line = `${JSON.stringify({ ...record, at: new Date().toISOString() })}\n`;
    this.written = this.written
      .then(() => appendFile(join(runFolder, "attempts.jsonl"), line))
      .catch((error: unknown) => {
        this.log.warn({ err: error, stateDir: runFolder }, "could not append to attempts.jsonl");
      });
  }

  /** Resolves once every line queued so far is written (or its failure logged). */
  flush(): Promise<void> {
    return this.written;
  }
}

export interface AttemptLogFile {
  /** `attempt-N.log`, as attempts.jsonl names it. */
  name: string;
  path: string;
  handle: FileHandle;
}

/** Creates `attempt-N.log` in the run folder; fails if it exists (a run folder is never reused). */
export async function createAttemptLog(runFolder: string, attempt: number): Promise<AttemptLogFile> {
  const name = `attempt-${attempt}.log`;
  const path = join(runFolder, name);
  return { name, path, handle: await open(path, "wx") };
}

/** What attempts.jsonl records as an attempt's settings: the launch's own, or its command line with secrets redacted; never the environment. */
export function recordedSettings(launch: EngineLaunch): Record<string, unknown> {
  return launch.settings ?? { command: launch.command, args: redactSecretArgs(launch.args), host: launch.host, port: launch.port };
}

/** The last lines of an attempt log, as a sentence for lastError. */
export async function logTail(logPath: string): Promise<string> {
  try {
    const file = await open(logPath, "r");
    try {
      const { size } = await file.stat();
      const length = Math.min(size, LOG_TAIL_BYTES);
      const buffer = Buffer.alloc(length);
      await file.read(buffer, 0, length, size - length);
      const lines = buffer
        .toString("utf8")
        .split(/\r?\n/)
        .filter((line) => line.trim() !== "");
      // The first line may be cut in the middle when the tail starts inside it.
      if (size > length) lines.shift();
      const tail = lines.slice(-LOG_TAIL_LINES);
      if (tail.length === 0) return `Its log ${logPath} is empty.`;
      return `Last lines of ${logPath}:\n${tail.join("\n")}`;
    } finally {
      await file.close();
    }
  } catch (error) {
    return `Its log ${logPath} could not be read: ${describeError(error)}.`;
  }
}

/** The values of key/token/secret/password flags (`--api-key X`, `--token=X`) replaced by "[redacted]". */
function redactSecretArgs(args: string[]): string[] {
  const out: string[] = [];
  for (let i = 0; i < args.length; i += 1) {
    const arg = args[i] as string;
    const equals = arg.indexOf("=");
    const flag = equals === -1 ? arg : arg.slice(0, equals);
    if (!arg.startsWith("-") || !SECRET_FLAG.test(flag)) {
      out.push(arg);
    } else if (equals !== -1) {
      out.push(`${flag}=[redacted]`);
    } else {
      out.push(arg);
      if (i + 1 < args.length) {
        out.push("[redacted]");
        i += 1;
      }
    }
  }
  return out;
}
