// `llmgw ctl job ...` and following a job as it runs. Serve and update jobs run on the
// server in steps (registry, mirror, check, catalog, placement or rollout, smoke test,
// retire); ctl lists them, shows one, cancels one, and follows one: a line per step as it
// starts and as it ends, a progress bar while the mirror step fetches, the smoke test's
// reply at the end. `followJob` is also what `model serve`, `update` and `rollback` run
// after starting their job, so the three and `job watch` look and exit the same.
import type { Command } from "commander";
import { LlmgwError, UpstreamError, errorCode } from "../core/errors.ts";
import { countOf, formatBytes, printable } from "../core/format.ts";
import type { AdminClient } from "./admin-client.ts";
import { parsePositiveInt } from "./config.ts";
import { type CtlHelpers, type CtlOptions as Options, wantsJson, withExamples } from "./ctl-common.ts";
import { progressBar } from "./ctl-mirror.ts";
import { renderTable } from "./output.ts";

// The wire shapes and finished states are the server's own (job-rows.ts loads nothing else of the server).
import {
  FINISHED_STATES,
  type JobResult,
  type JobState,
  type JobStep,
  type JobView,
  type StepProgress as JobStepProgress,
  type StepState as JobStepState,
} from "../serve/job-rows.ts";
export type { JobResult, JobState, JobStep, JobStepProgress, JobStepState, JobView };

// A waiting step ends the follow too (the job waits for room, see describeJobEnd), so its line is printed.
const ENDED_STEP_STATES: ReadonlySet<JobStepState> = new Set(["done", "failed", "skipped", "cancelled", "waiting"]);
const STEP_MARKS: Record<JobStepState, string> = { pending: " ", running: "…", done: "✓", failed: "✗", skipped: "-", cancelled: "✗", waiting: "~" };
/** Wide enough for the longest step name ("placement", "smoke_test") and a space. */
const STEP_NAME_WIDTH = 11;
const DEFAULT_POLL_MS = 500;
/** A server restart takes seconds; half a minute unreachable is a server that is down. */
const DEFAULT_LOST_AFTER_MS = 30_000;
/** Without a terminal to redraw on, one progress line per this long is enough for a log. */
const PLAIN_PROGRESS_EVERY_MS = 5000;

/** Where the progress bar goes: stderr, or a stand-in in tests. */
export interface ProgressStream {
  write(text: string): unknown;
  isTTY?: boolean;
}

export interface FollowJobOptions {
  /** Draw the mirror step's progress bar (off for --json). */
  draw: boolean;
  /** Receives each step line and the smoke test's reply, one line a call. Default: stdout. */
  out?: (line: string) => void;
  /** Where the progress bar is drawn. Default: stderr. */
  progressTo?: ProgressStream;
  /** Time between two polls. Default 500 ms. */
  pollMs?: number;
  /** How long the server may stay unreachable before the follow gives up. Default 30 s. */
  lostAfterMs?: number;
}

/**
 * Polls the job until it finishes (done, waiting, failed or cancelled) and returns its
 * final view. Each step is printed once when it is seen running and once when it ends, in
 * the job's step order; a step that starts and ends between two polls gets its end line
 * only. Ctrl-C stops following (exit 130) and leaves the job running on the server.
 */
export async function followJob(client: Pick<AdminClient, "call">, jobId: string, options: FollowJobOptions): Promise<JobView> {
  const out = options.out ?? ((line: string) => void process.stdout.write(`${line}\n`));
  const progress = new ProgressLine(options.draw ? (options.progressTo ?? process.stderr) : null);
  const printLine = (line: string) => {
    progress.clear();
    out(line);
  };
  const reported = new Map<number, "running" | "ended">();
  const lostAfterMs = options.lostAfterMs ?? DEFAULT_LOST_AFTER_MS;
  const stopFollowing = () => {
    progress.clear();
    process.stderr.write(
      `\nStopped following job ${jobId}; it goes on on the server. Follow it again with 'llmgw ctl job watch ${jobId}', stop it with 'llmgw ctl job cancel ${jobId}'.\n`,
    );
    process.exit(130);
  };
  process.once("SIGINT", stopFollowing);
  try {
    let unreachableSince: number | null = null;
    for (;;) {
      let job: JobView;
      try {
        job = await client.call<JobView>("GET", `/api/v1/jobs/${encodeURIComponent(jobId)}`);
        unreachableSince = null;
      } catch (error) {
        const reason = unreachableReason(error);
        if (reason === null) throw error;
        unreachableSince ??= Date.now();
        if (Date.now() - unreachableSince >= lostAfterMs) {
          progress.clear();
          throw new UpstreamError(
            `Lost the llmgw server (${reason}) for ${Math.round(lostAfterMs / 1000)} s while following job ${jobId}; the job goes on once the server is back. Follow it again with 'llmgw ctl job watch ${jobId}'.`,
            { code: "job_follow_lost", cause: error },
          );
        }
        await sleep(options.pollMs ?? DEFAULT_POLL_MS);
        continue;
      }
      job.steps.forEach((step, index) => {
        const seen = reported.get(index);
        if (ENDED_STEP_STATES.has(step.state) && seen !== "ended") {
          reported.set(index, "ended");
          printLine(describeStep(step));
        } else if (step.state === "running" && seen === undefined) {
          reported.set(index, "running");
          printLine(describeStep(step));
        }
      });
      if (FINISHED_STATES.has(job.state)) {
        progress.clear();
        if (job.result !== null) out(describeSmokeTest(job.result));
        return job;
      }
      const fetching = job.steps.find((step) => step.name === "mirror" && step.state === "running");
      if (fetching?.progress !== undefined) progress.show(describeProgress(fetching.progress));
      await sleep(options.pollMs ?? DEFAULT_POLL_MS);
    }
  } finally {
    process.removeListener("SIGINT", stopFollowing);
  }
}

/**
 * Why a poll did not reach the server, or null when it did (an HTTP error from llmgw
 * itself ends the follow). The admin client throws UpstreamError only when it cannot
 * connect; 502-504 are what a proxy in front of a restarting llmgw answers.
 */
function unreachableReason(error: unknown): string | null {
  if (error instanceof UpstreamError) return errorCode((error as { cause?: unknown }).cause) ?? "unreachable";
  if (error instanceof LlmgwError && error.status >= 502 && error.status <= 504) return `HTTP ${error.status}`;
  return null;
}

/** One redrawn line on a terminal; on anything else, a plain line every few seconds at most. */
class ProgressLine {
  private drawn = false;
  private lastPlainLineAt = 0;

  constructor(private readonly stream: ProgressStream | null) {}

  show(line: string): void {
    if (this.stream === null) return;
    if (this.stream.isTTY === true) {
      this.stream.write(`\r${line}\u001b[K`);
      this.drawn = true;
    } else if (Date.now() - this.lastPlainLineAt >= PLAIN_PROGRESS_EVERY_MS) {
      this.stream.write(`${line}\n`);
      this.lastPlainLineAt = Date.now();
    }
  }

  /** Removes the redrawn bar so that a step line does not land behind it. */
  clear(): void {
    if (!this.drawn || this.stream === null) return;
    this.stream.write("\r\u001b[K");
    this.drawn = false;
  }
}

/** `✓ registry   llmgw-test/tiny-llama-GGUF@1a2b3c4d: Q4_K_M, 1 file, 2.1 MB` */
export function describeStep(step: JobStep): string {
  const text = step.detail ?? (step.state === "running" ? "running" : step.state);
  // A smoke test's detail quotes the model's reply: no control character reaches the terminal.
  // biome-ignore lint/suspicious/noControlCharactersInRegex: it matches control characters so that they are escaped before the text reaches a terminal.
  const shown = oneLine(text).replace(/[\u0000-\u001f\u007f]/g, (c) => `\\x${c.charCodeAt(0).toString(16).padStart(2, "0")}`);
  return `${STEP_MARKS[step.state]} ${step.name.padEnd(STEP_NAME_WIDTH)}${shown}`;
}

/** The mirror step's bar: bytes, speed, time left and files. */
export function describeProgress(progress: JobStepProgress): string {
  const parts = [`${progressBar(progress.bytes_done, progress.bytes_total)} ${formatBytes(progress.bytes_done)} / ${formatBytes(progress.bytes_total)}`];
  if (progress.bytes_per_second !== null) parts.push(`${formatBytes(progress.bytes_per_second)}/s`);
  if (progress.eta_seconds !== null) parts.push(`${formatDuration(progress.eta_seconds)} left`);
  parts.push(`${progress.files_done}/${countOf(progress.files_total, "file")}`);
  return parts.join("  ");
}

export function describeSmokeTest(result: JobResult): string {
  return `Smoke test: ${result.replica} on ${result.node} replied "${printable(oneLine(result.reply))}" (${result.tokens_per_second.toFixed(1)} tokens/s, ${countOf(result.completion_tokens, "token")})`;
}

/**
 * How a finished job ended, for people: `problem` is set (one line, for stderr) when it
 * failed or was cancelled, which makes the command exit non-zero; `summary` otherwise.
 */
export function describeJobEnd(job: JobView): { summary: string; problem: null } | { summary: null; problem: string } {
  const model = job.model ?? requestedModel(job);
  const name = model === null ? "the model" : `'${model}'`;
  if (job.state === "failed") {
    const step = job.steps.find((s) => s.state === "failed");
    return {
      summary: null,
      problem: `Job ${job.id} failed${step === undefined ? "" : ` at ${step.name}`}: ${oneLine(job.error ?? "no error recorded")}${job.error === null ? `; 'llmgw ctl job show ${job.id}' has its steps.` : ""}`,
    };
  }
  if (job.state === "cancelled") return { summary: null, problem: `Job ${job.id} was cancelled${job.error === null ? "." : `: ${oneLine(job.error)}`}` };
  if (job.state === "waiting") {
    return {
      summary: `${name} is in the catalog and waits for room${job.error === null ? "" : `: ${oneLine(job.error)}`}. A replica starts once a node has room, and job ${job.id} then goes on by itself to its smoke test ('llmgw ctl job show ${job.id}' shows where it is); ${model === null ? "'llmgw ctl model show NAME'" : `'llmgw ctl model show ${model}'`} says what it waits for.`,
      problem: null,
    };
  }
  const done = job.kind === "serve" ? "is served" : job.request.rollback === true ? "is rolled back" : "is updated";
  return { summary: `Done: ${name} ${done} (job ${job.id}).`, problem: null };
}

/**
 * After a command started a job: with `detach`, prints its id (alone on stdout, so that
 * `job=$(llmgw ctl model serve ... --detach)` holds it; what it is and how to follow it go
 * to stderr) or, with --json, the started JobView; otherwise follows it to the end (step
 * lines on stderr with --json, whose stdout is the final JobView) and reports how it
 * ended, exiting non-zero when it failed or was cancelled.
 */
export async function followStartedJob(options: {
  helpers: CtlHelpers;
  command: Command;
  client: Pick<AdminClient, "call">;
  started: JobView;
  detach: boolean;
}): Promise<void> {
  const { helpers, command, started } = options;
  if (options.detach) {
    if (!wantsJson(command))
      process.stderr.write(`Started job ${started.id}: ${describeJobSubject(started)}. Follow it with 'llmgw ctl job watch ${started.id}'.\n`);
    helpers.print(command, started, () => started.id);
    return;
  }
  if (!wantsJson(command)) process.stdout.write(`Started job ${started.id}: ${describeJobSubject(started)}. Ctrl-C stops following, not the job.\n`);
  await followAndReport(command, options.client, started.id);
}

async function followAndReport(command: Command, client: Pick<AdminClient, "call">, jobId: string): Promise<void> {
  const json = wantsJson(command);
  const job = await followJob(client, jobId, { draw: !json, ...(json ? { out: (line: string) => void process.stderr.write(`${line}\n`) } : {}) });
  const end = describeJobEnd(job);
  if (json) process.stdout.write(`${JSON.stringify(job, null, 2)}\n`);
  else if (end.summary !== null) process.stdout.write(`${end.summary}\n`);
  if (end.problem !== null) {
    process.stderr.write(`error: ${end.problem}\n`);
    process.exitCode = 1;
  }
}

export function registerJobCommands(ctl: Command, helpers: CtlHelpers): void {
  const { connect, print } = helpers;
  const job = ctl.command("job").description("Serve and update jobs: the steps that take a repository to a served model");
  withExamples(job.command("list"), "llmgw ctl job list --state running", "llmgw ctl job list --kind update --json")
    .description("Jobs, newest first: kind, model, state, the running (or last) step, age and error")
    .option("--state <state>", "only jobs in this state: queued, running, done, waiting, failed or cancelled")
    .option("--kind <kind>", "only serve or only update jobs")
    .option("--limit <n>", "at most this many")
    .option("--json", "print JSON")
    .action(async (options: Options, command: Command) => {
      const query = new URLSearchParams();
      if (typeof options.state === "string") query.set("state", options.state);
      if (typeof options.kind === "string") query.set("kind", options.kind);
      if (typeof options.limit === "string") query.set("limit", String(parsePositiveInt(options.limit, "--limit")));
      const { data } = await connect(command).call<{ data: JobView[] }>("GET", `/api/v1/jobs${query.size > 0 ? `?${query}` : ""}`);
      print(command, data, () =>
        data.length === 0
          ? query.size > 0
            ? "No jobs match."
            : "No jobs yet. Start one with 'llmgw ctl model serve OWNER/NAME'."
          : renderTable(
              ["ID", "KIND", "MODEL", "STATE", "STEP", "AGE", "ERROR"],
              data.map((j) => [
                j.id,
                j.kind,
                j.model ?? requestedModel(j),
                j.state,
                currentStep(j)?.name,
                formatAge(j.created_at),
                j.error === null ? null : oneLine(j.error),
              ]),
            ),
      );
    });
  withExamples(job.command("show <id>"), "llmgw ctl job show 0c9d2f3e")
    .description("One job: what it was asked, its steps with their details, the smoke test's result and the error")
    .option("--json", "print JSON")
    .action(async (id: string, _options: Options, command: Command) => {
      const shown = await connect(command).call<JobView>("GET", `/api/v1/jobs/${encodeURIComponent(id)}`);
      print(command, shown, () => renderJob(shown));
    });
  withExamples(job.command("watch <id>"), "llmgw ctl job watch 0c9d2f3e")
    .description("Follow a job until it ends: its steps, the mirror's progress and the smoke test's reply; exits non-zero when it fails or is cancelled")
    .option("--json", "print the final job as JSON (step lines go to stderr)")
    .action(async (id: string, _options: Options, command: Command) => {
      await followAndReport(command, connect(command), id);
    });
  withExamples(job.command("cancel <id>"), "llmgw ctl job cancel 0c9d2f3e")
    .description(
      "Stop a queued, running or waiting job and undo what it started: a serve job removes the model it added to the catalog (a waiting one's model included), which stops its replicas; an update returns the model to the revision it served, unless the new one already passed its smoke test. Files already verified stay in the mirror",
    )
    .option("--json", "print JSON")
    .action(async (id: string, _options: Options, command: Command) => {
      const cancelled = await connect(command).call<JobView>("POST", `/api/v1/jobs/${encodeURIComponent(id)}/cancel`);
      print(command, cancelled, () =>
        cancelled.state === "cancelled"
          ? `Cancelled job ${cancelled.id}.`
          : `Job ${cancelled.id} is stopping (now ${cancelled.state}); 'llmgw ctl job watch ${cancelled.id}' follows it until it stops.`,
      );
    });
}

function renderJob(job: JobView): string {
  const lines = [`job ${job.id}: ${describeJobSubject(job)}, ${job.state}`];
  const resumed = job.resumed > 0 ? `; resumed ${countOf(job.resumed, "time")} after a server restart` : "";
  lines.push(`created by ${job.created_by} at ${job.created_at}${job.finished_at === null ? "" : `, finished at ${job.finished_at}`}${resumed}`);
  lines.push("", ...job.steps.map((step) => `  ${describeStep(step)}${stepDuration(step)}`));
  if (job.result !== null) lines.push("", describeSmokeTest(job.result));
  if (job.error !== null) lines.push("", `error: ${oneLine(job.error)}`);
  return lines.join("\n");
}

/** "serve llmgw-test/tiny-llama-GGUF as tiny", "update tiny to 1a2b3c4d", "rollback of tiny". */
export function describeJobSubject(job: JobView): string {
  const request = job.request;
  const text = (key: string) => (typeof request[key] === "string" ? (request[key] as string) : null);
  if (job.kind === "serve") {
    const name = job.model ?? text("name");
    return `serve ${text("repo") ?? "?"}${text("revision") === null ? "" : `@${text("revision")}`}${name === null ? "" : ` as '${name}'`}`;
  }
  const model = job.model ?? text("model") ?? "?";
  if (request.rollback === true) return `rollback of '${model}'`;
  return `update of '${model}'${text("revision") === null ? " to the latest revision" : ` to ${text("revision")}`}`;
}

function requestedModel(job: JobView): string | null {
  const value = job.kind === "serve" ? job.request.name : job.request.model;
  return typeof value === "string" ? value : null;
}

/**
 * The step a job is at: the running one, else the one it failed or was cancelled at (the
 * steps after it are marked skipped, and naming one of those would point at the wrong
 * place), else the last one that ran.
 */
export function currentStep(job: JobView): JobStep | undefined {
  return (
    job.steps.find((step) => step.state === "running") ??
    job.steps.find((step) => step.state === "failed" || step.state === "cancelled") ??
    job.steps.findLast((step) => step.state !== "pending" && step.state !== "skipped") ??
    job.steps.findLast((step) => step.state !== "pending")
  );
}

function stepDuration(step: JobStep): string {
  if (step.started_at === null || step.finished_at === null) return "";
  return ` (${formatDuration((Date.parse(step.finished_at) - Date.parse(step.started_at)) / 1000)})`;
}

/** Time since `iso`, short: "45s", "12m", "3h", "2d". */
function formatAge(iso: string): string {
  const seconds = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  if (seconds < 60) return `${seconds}s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m`;
  if (seconds < 86_400) return `${Math.floor(seconds / 3600)}h`;
  return `${Math.floor(seconds / 86_400)}d`;
}

/** "42s", "3m 05s", "1h 04m". */
function formatDuration(totalSeconds: number): string {
  const seconds = Math.max(0, Math.round(totalSeconds));
  if (seconds < 60) return `${seconds}s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m ${String(seconds % 60).padStart(2, "0")}s`;
  return `${Math.floor(seconds / 3600)}h ${String(Math.floor((seconds % 3600) / 60)).padStart(2, "0")}m`;
}

/** Server text on one line: runs of white space (newlines too) become one space. */
function oneLine(text: string): string {
  return text.replace(/\s+/g, " ").trim();
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
