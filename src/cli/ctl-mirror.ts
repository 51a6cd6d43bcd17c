// `llmgw ctl mirror ...`: the weights mirror over the admin API. `fetch` starts a fetch
// (what the plan recommends for the fleet's hardware unless told a quantisation or file)
// and follows it with a progress bar; `verify` hashes mirrored files again and reports each
// one; `list` and `rm` show and delete versions (a version a catalog model uses only with
// --force); `replicate` copies a version onto other servers of a cluster and follows the
// copies. Each command exits non-zero when what it did failed. The progress bar is shared
// with the serve jobs' mirror step (ctl-job.ts).
import { countOf } from "../core/format.ts";
import type { Command } from "commander";
import { UpstreamError } from "../core/errors.ts";
import { formatBytes } from "../gguf/memory-estimate.ts";
import { absoluteRepoArgument } from "./local-paths.ts";
import type { MirrorDiskUsage, MirrorFileView } from "../mirror/mirror-types.ts";
import type { AdminClient } from "./admin-client.ts";
import { parsePositiveInt } from "./config.ts";
import { type CtlHelpers, type CtlOptions as Options, withExamples } from "./ctl-common.ts";
import { renderTable } from "./output.ts";

/** The answer to POST /api/v1/mirror: the fetch the server started (mirror-routes.ts). */
interface StartedFetch {
  model: string;
  version: string;
  repo: string;
  revision: string;
  set: string;
  picked: { by: string; artifact: string; reason: string };
  files: { path: string; size: number; sha256: string | null }[];
  totalBytes: number;
  progress: string;
}

/** The answer to GET /api/v1/mirror: the files, and the mirror's disk use. */
interface MirrorListing {
  data: MirrorFileView[];
  disk: MirrorDiskUsage;
}

interface DeletedFiles {
  model: string;
  version: string;
  files: number;
  bytes: number;
}

/** The answer to DELETE /api/v1/mirror/:model/:version; `forced` and `usedBy` when catalog models used it. */
interface DeletedVersion {
  deleted: (DeletedFiles & { forced?: undefined }) | (DeletedFiles & { forced: true; usedBy: string[] });
}

export function registerMirrorCommands(ctl: Command, { connect, print }: CtlHelpers): void {
  const mirror = ctl.command("mirror").description("The weights mirror: files fetched from the registry and verified");
  withExamples(mirror.command("fetch <repo>"), "llmgw ctl mirror fetch llmgw-test/tiny-llama-GGUF --quant Q4_K_M")
    .description(
      "Fetch a repository's artifact into the mirror, verifying every file, and show progress; without --quant or --file, what 'ctl model plan' recommends for the fleet's hardware",
    )
    .option("--quant <label>", "GGUF quantisation, e.g. Q8_0")
    .option("--file <path>", "an exact file of the repository")
    .option("--format <format>", "gguf or safetensors")
    .option("--revision <rev>", "branch, tag or commit (default main)")
    .option("--model <name>", "the mirror's name for the model (default owner--name)")
    .option("--context <n>", "context (tokens) the plan picks an artifact for (default: as 'ctl model plan')")
    .option("--no-wait", "start the fetch and return")
    .option("--json", "print JSON")
    .action(async (repo: string, options: Options, command: Command) => {
      const client = connect(command);
      const started = await client.call<StartedFetch>("POST", "/api/v1/mirror", {
        // The server resolves paths on its own machine: send this shell's paths absolute.
        repo: absoluteRepoArgument(repo),
        ...pick(options, ["quant", "file", "format", "revision", "model"]),
        ...(typeof options.context === "string" ? { context: parsePositiveInt(options.context, "--context") } : {}),
      });
      const json = command.optsWithGlobals().json === true;
      if (options.wait === false) {
        print(
          command,
          started,
          () =>
            `${describePick(started.picked)}\nFetching ${started.set} of ${started.repo} as ${started.model}/${started.version} (${countOf(started.files.length, "file")}, ${formatBytes(started.totalBytes)}). Follow with 'llmgw ctl mirror list'.`,
        );
        return;
      }
      if (!json) process.stdout.write(`${describePick(started.picked)}\n`);
      const followed = await followFetch(client, started, { draw: !json });
      print(command, followed.files, () => describeFetchOutcome(started, followed, serveCommandFor(repo, options)));
      if (followed.state === "interrupted" || followed.files.some((f) => f.state === "failed")) process.exitCode = 1;
    });
  withExamples(mirror.command("list"), "llmgw ctl mirror list --model tiny")
    .description("Mirrored files by model and version, with their state, and the mirror's disk use")
    .option("--model <name>", "only this model")
    .option("--json", "print JSON")
    .action(async (options: Options, command: Command) => {
      const query = typeof options.model === "string" ? `?model=${encodeURIComponent(options.model)}` : "";
      const result = await connect(command).call<MirrorListing>("GET", `/api/v1/mirror${query}`);
      print(command, result, () => {
        if (result.data.length === 0) return "The mirror is empty. Fetch with 'llmgw ctl mirror fetch OWNER/NAME'.";
        // Where the bytes are only matters with several servers: the column shows when a server keeps holder rows.
        const clustered = result.data.some((f) => Array.isArray(f.holders) && f.holders.length > 0);
        const table = renderTable(
          ["MODEL", "VERSION", "FILE", "STATE", "DONE", "SIZE", ...(clustered ? ["HOLDERS"] : []), "ERROR"],
          result.data.map((f) => [
            f.model,
            f.version,
            f.file,
            f.state,
            f.percent === null ? null : `${f.percent}%`,
            f.bytesTotal === null ? null : formatBytes(f.bytesTotal),
            ...(clustered ? [(f.holders ?? []).join(",") || null] : []),
            f.error,
          ]),
        );
        const disk = result.disk;
        return `${table}\n\nMirror ${disk.root}: ${formatBytes(disk.bytes)} used (${formatBytes(disk.partialBytes)} partial)${disk.freeBytes === null ? "" : `, ${formatBytes(disk.freeBytes)} free`}.`;
      });
    });
  withExamples(mirror.command("verify [model] [version]"), "llmgw ctl mirror verify tiny")
    .description("Hash mirrored files again (all, one model's, or one version's); a file that no longer matches is marked failed and no longer served")
    .option("--json", "print JSON")
    .action(async (modelName: string | undefined, version: string | undefined, _options: Options, command: Command) => {
      const client = connect(command);
      const json = command.optsWithGlobals().json === true;
      const started = await client.call<VerificationRun>("POST", "/api/v1/mirror/verify", {
        ...(modelName === undefined ? {} : { model: modelName }),
        ...(version === undefined ? {} : { version }),
      });
      const run = await followVerification(client, started, {
        draw: !json,
        onFile: json ? undefined : (file) => process.stdout.write(`${describeVerifiedFile(file)}\n`),
      });
      print(command, run, () => describeVerification(run));
      if (run.state !== "done" || run.failed > 0) process.exitCode = 1;
    });
  withExamples(mirror.command("replicate <model> <version>"), "llmgw ctl mirror replicate tiny 1a2b3c4d5e6f --to all")
    .description(
      "Copy a mirrored version onto another server of the cluster (or, with --to all, onto every running server that lacks a file of it), verified against its sha256, so that server serves it from its own disk; shows progress",
    )
    .requiredOption("--to <server>", "the server to copy to (a name from 'llmgw ctl cluster status'), or all")
    .option("--no-wait", "start the copies and return")
    .option("--json", "print JSON")
    .action(async (modelName: string, version: string, options: Options, command: Command) => {
      const client = connect(command);
      const json = command.optsWithGlobals().json === true;
      const started = await client.call<{ runs: ReplicationRun[] }>("POST", "/api/v1/mirror/replicate", { model: modelName, version, to: options.to });
      const runs = options.wait === false ? started.runs : await followReplication(client, started.runs, { draw: !json });
      print(command, { ...started, runs }, () => describeReplication(modelName, version, runs, options.wait === false));
      if (runs.some((run) => run.state === "failed" || (options.wait !== false && run.state !== "done"))) process.exitCode = 1;
    });
  withExamples(mirror.command("rm <model> <version>"), "llmgw ctl mirror rm tiny 1a2b3c4d5e6f")
    .description("Delete a mirrored version and its files (refused while a catalog model uses it, unless --force)")
    .option("--force", "delete even though catalog models use it (they are left without weights)")
    .option("--json", "print JSON")
    .action(async (modelName: string, version: string, options: Options, command: Command) => {
      const query = options.force === true ? "?force=true" : "";
      const result = await connect(command).call<DeletedVersion>(
        "DELETE",
        `/api/v1/mirror/${encodeURIComponent(modelName)}/${encodeURIComponent(version)}${query}`,
      );
      const { deleted } = result;
      const forced =
        deleted.forced === true
          ? ` The ${deleted.usedBy.length === 1 ? "catalog model" : "catalog models"} ${deleted.usedBy.map((n: string) => `'${n}'`).join(", ")} used it and now ${deleted.usedBy.length === 1 ? "has" : "have"} no weights.`
          : "";
      print(command, result, () => `Deleted ${deleted.model}/${deleted.version}: ${countOf(deleted.files, "file")}, ${formatBytes(deleted.bytes)}.${forced}`);
    });
}

/** The `model serve` line that fetches the same artifact and serves it in one step. */
function serveCommandFor(repo: string, options: Options): string {
  const flags = (["revision", "quant", "file", "format"] as const)
    .filter((name) => typeof options[name] === "string")
    .map((name) => ` --${name} ${options[name] as string}`);
  return `llmgw ctl model serve ${repo}${flags.join("")}`;
}

function pick(options: Options, names: string[]): Record<string, string> {
  return Object.fromEntries(names.filter((name) => typeof options[name] === "string").map((name) => [name, options[name] as string]));
}

/** The line that says which artifact the server picked and why. */
function describePick(picked: { artifact: string; reason: string } | undefined): string {
  if (picked === undefined) return "";
  const reason = picked.reason.trim();
  return `Picked ${picked.artifact}: ${reason}${reason.endsWith(".") ? "" : "."}`;
}

export interface FollowFetchOptions {
  /** Draw a progress bar on stderr. */
  draw: boolean;
  /** How long the fetch's rows may take to appear before ctl gives up. Default 10 s. */
  appearTimeoutMs?: number;
  /** Time between two polls. Default 500 ms. */
  pollMs?: number;
}

/**
 * How a followed fetch ended: `settled` when every file is complete or failed and nothing
 * works on it any more; `interrupted` when files are left pending (or fetching) that the
 * server no longer works on: it restarted (recover() leaves them pending) or stopped the fetch.
 */
export interface FollowedFetch {
  state: "settled" | "interrupted";
  files: MirrorFileView[];
}

/**
 * Polls the mirror until the started version settles or stops moving, drawing progress.
 * It never waits on rows that nothing will change: files that are not active on the
 * server end the wait as interrupted, and a fetch whose rows do not appear within
 * `appearTimeoutMs` (while nothing is active) is given up with an error that says what to do.
 */
export async function followFetch(
  client: Pick<AdminClient, "call">,
  started: { model: string; version: string; repo: string; files: { path: string }[] },
  options: FollowFetchOptions,
): Promise<FollowedFetch> {
  const wanted = new Set(started.files.map((f) => f.path));
  const tty = options.draw && process.stderr.isTTY === true;
  const appearTimeoutMs = options.appearTimeoutMs ?? 10_000;
  const appearBy = Date.now() + appearTimeoutMs;
  let lastLine = 0;
  for (;;) {
    const { data } = await client.call<{ data: MirrorFileView[] }>("GET", `/api/v1/mirror?model=${encodeURIComponent(started.model)}`);
    const files = data.filter((f) => f.version === started.version && wanted.has(f.file));
    const done = files.reduce((sum, f) => sum + f.bytesDone, 0);
    const total = files.reduce((sum, f) => sum + (f.bytesTotal ?? 0), 0);
    // Only the server's in-memory `active` says that something still works on a file: a
    // row's state alone may be what an earlier run left behind.
    const idle = files.every((f) => f.active !== true);
    const allListed = files.length === wanted.size;
    const state: FollowedFetch["state"] | null =
      !allListed || !idle ? null : files.every((f) => f.state === "complete" || f.state === "failed") ? "settled" : "interrupted";
    if (options.draw) {
      const line = `${progressBar(done, total)} ${formatBytes(done)} / ${formatBytes(total)}  ${files.filter((f) => f.state === "complete").length}/${countOf(wanted.size, "file")}`;
      if (tty) process.stderr.write(`\r${line}\u001b[K`);
      else if (state !== null || Date.now() - lastLine > 5000) {
        process.stderr.write(`${line}\n`);
        lastLine = Date.now();
      }
    }
    if (state !== null) {
      if (tty) process.stderr.write("\n");
      return { state, files };
    }
    if (!allListed && idle && Date.now() >= appearBy) {
      if (tty) process.stderr.write("\n");
      throw new UpstreamError(
        `The server accepted the fetch of ${started.repo} as ${started.model}/${started.version}, but ${files.length === 0 ? "none" : `only ${files.length}`} of its ` +
          `${countOf(wanted.size, "file")} appeared in the mirror within ${appearTimeoutMs / 1000} s and nothing is fetching them. ` +
          `The server log says why ('mirror fetch stopped'); 'llmgw ctl mirror list --model ${started.model}' shows what is there. Then run the same fetch again.`,
        { code: "mirror_fetch_lost" },
      );
    }
    await new Promise((resolve) => setTimeout(resolve, options.pollMs ?? 500));
  }
}

/** `[#####-----]  50.0%`: the bar ctl draws for byte counts (mirror fetch, verify, a job's mirror step). */
export function progressBar(done: number, total: number, width = 30): string {
  const ratio = total > 0 ? Math.min(1, done / total) : 0;
  const filled = Math.round(ratio * width);
  return `[${"#".repeat(filled)}${"-".repeat(width - filled)}] ${(ratio * 100).toFixed(1).padStart(5)}%`;
}

function describeFetchOutcome(started: { model: string; version: string; repo: string }, followed: FollowedFetch, serveCommand: string): string {
  const { files } = followed;
  const failed = files.filter((f) => f.state === "failed");
  const failures = failed.map((f) => `  ${f.file}: ${f.error}`).join("\n");
  if (followed.state === "interrupted") {
    const left = files.filter((f) => f.state !== "complete" && f.state !== "failed");
    const done = files.reduce((sum, f) => sum + f.bytesDone, 0);
    const total = files.reduce((sum, f) => sum + (f.bytesTotal ?? 0), 0);
    return (
      `The fetch of ${started.repo} as ${started.model}/${started.version} was interrupted: ${left.length} of ${countOf(files.length, "file")} ${left.length === 1 ? "is" : "are"} unfinished ` +
      `(${formatBytes(done)} of ${formatBytes(total)} on disk) and the server is no longer fetching ${left.length === 1 ? "it" : "them"}; it was restarted or stopped the fetch.` +
      `${failed.length === 0 ? "" : `\n${failed.length} failed:\n${failures}`}\nRun the same fetch again to resume; completed files and partial downloads are kept.`
    );
  }
  if (failed.length === 0) {
    const entry = files[0]?.file ?? "";
    return (
      `Mirrored ${started.repo} as ${started.model}/${started.version} (${countOf(files.length, "file")} verified).\n` +
      `Serve it: llmgw ctl model add NAME --mirror ${started.model}/${started.version}/${entry}\n` +
      `Or fetch, add, place and smoke-test in one command: ${serveCommand}`
    );
  }
  return `${failed.length} of ${countOf(files.length, "file")} failed:\n${failures}\nRun the same fetch again to retry; completed files are kept.`;
}

export interface VerifiedFile {
  model: string;
  version: string;
  file: string;
  result: "pending" | "hashing" | "ok" | "failed" | "skipped";
  bytesDone: number;
  message: string | null;
}

export interface VerificationRun {
  id: string;
  state: "running" | "done" | "stopped";
  totalBytes: number;
  ok: number;
  failed: number;
  skipped: number;
  files: VerifiedFile[];
  error: string | null;
  progress?: string;
}

/**
 * Polls a verification until it ends, drawing progress (bytes hashed of all) and handing
 * each file's result to `onFile` once, as it arrives.
 */
export async function followVerification(
  client: Pick<AdminClient, "call">,
  started: VerificationRun,
  options: { draw: boolean; onFile?: ((file: VerifiedFile) => void) | undefined; pollMs?: number },
): Promise<VerificationRun> {
  const tty = options.draw && process.stderr.isTTY === true;
  const reported = new Set<string>();
  for (let run = started; ; ) {
    const fresh = run.files.filter(
      (f) => (f.result === "ok" || f.result === "failed" || f.result === "skipped") && !reported.has(`${f.model}/${f.version}/${f.file}`),
    );
    if (fresh.length > 0 && tty) process.stderr.write("\r\u001b[K");
    for (const file of fresh) {
      reported.add(`${file.model}/${file.version}/${file.file}`);
      options.onFile?.(file);
    }
    if (tty) {
      const done = run.files.reduce((sum, f) => sum + f.bytesDone, 0);
      process.stderr.write(
        `\r${progressBar(done, run.totalBytes)} ${formatBytes(done)} / ${formatBytes(run.totalBytes)}  ${reported.size}/${countOf(run.files.length, "file")} checked\u001b[K`,
      );
    }
    if (run.state !== "running") {
      if (tty) process.stderr.write("\n");
      return run;
    }
    await new Promise((resolve) => setTimeout(resolve, options.pollMs ?? 500));
    run = await client.call<VerificationRun>("GET", `/api/v1/mirror/verify/${encodeURIComponent(started.id)}`);
  }
}

function describeVerifiedFile(file: VerifiedFile): string {
  const name = `${file.model}/${file.version}/${file.file}`;
  if (file.result === "ok") return `ok       ${name}`;
  return `${file.result === "failed" ? "FAILED " : "skipped"}  ${name}: ${file.message ?? ""}`;
}

function describeVerification(run: VerificationRun): string {
  if (run.files.length === 0) return "Nothing to verify: the mirror holds no files. Fetch with 'llmgw ctl mirror fetch OWNER/NAME'.";
  const counts = `${countOf(run.files.length, "file")}: ${run.ok} ok, ${run.failed} failed, ${run.skipped} skipped`;
  if (run.state === "stopped") return `${run.error ?? "The verification stopped."} So far ${counts}.`;
  const failed = run.failed === 0 ? "" : " Failed files are no longer served; fetch their versions again to replace them.";
  return `Verified ${counts}.${failed}`;
}

export interface ReplicationRun {
  server: string;
  model: string;
  version: string;
  state: "running" | "done" | "failed";
  totalBytes: number;
  bytesDone: number;
  copied: number;
  alreadyHeld: number;
  failed: number;
  files: { file: string; from: string | null; state: string; error: string | null }[];
  error: string | null;
}

/** Polls each server's run until none is running, drawing one bar for the bytes of all of them. */
export async function followReplication(
  client: Pick<AdminClient, "call">,
  started: ReplicationRun[],
  options: { draw: boolean; pollMs?: number },
): Promise<ReplicationRun[]> {
  const tty = options.draw && process.stderr.isTTY === true;
  let runs = started;
  for (;;) {
    if (tty) {
      const done = runs.reduce((sum, run) => sum + run.bytesDone, 0);
      const total = runs.reduce((sum, run) => sum + run.totalBytes, 0);
      const copying = runs.filter((run) => run.state === "running").length;
      process.stderr.write(
        `\r${progressBar(done, total)} ${formatBytes(done)} / ${formatBytes(total)}  ${copying} of ${countOf(runs.length, "server")} copying\u001b[K`,
      );
    }
    if (runs.every((run) => run.state !== "running")) {
      if (tty) process.stderr.write("\n");
      return runs;
    }
    await new Promise((resolve) => setTimeout(resolve, options.pollMs ?? 500));
    runs = await Promise.all(
      runs.map(async (run) => {
        if (run.state !== "running") return run;
        const path = `/api/v1/mirror/replicate/${encodeURIComponent(run.model)}/${encodeURIComponent(run.version)}?server=${encodeURIComponent(run.server)}`;
        try {
          return await client.call<ReplicationRun>("GET", path);
        } catch (error) {
          // The copying server stopped (or cannot be reached): its copy resumes when replicate runs again.
          return {
            ...run,
            state: "failed" as const,
            error: `Lost track of the copy on '${run.server}': ${error instanceof Error ? error.message : String(error)}`,
          };
        }
      }),
    );
  }
}

function describeReplication(model: string, version: string, runs: ReplicationRun[], started: boolean): string {
  if (runs.length === 0) return `Every running server holds every file of ${model}/${version} already; nothing to copy.`;
  const lines = runs.map((run) => {
    if (run.state === "failed" && run.files.length === 0) return `${run.server}: not started: ${run.error ?? "no reason given"}`;
    const counts = `${run.copied} copied, ${run.alreadyHeld} already held${run.failed > 0 ? `, ${run.failed} failed` : ""}, ${formatBytes(run.bytesDone)} of ${formatBytes(run.totalBytes)}`;
    const failures = run.files
      .filter((f) => f.state === "failed")
      .map((f) => `\n  ${f.file}: ${f.error ?? "failed"}`)
      .join("");
    const stopped = run.error === null ? "" : `\n  ${run.error}`;
    return `${run.server}: ${run.state} (${counts})${failures}${stopped}`;
  });
  const follow = started ? `\nFollow with 'llmgw ctl mirror list --model ${model}' (the HOLDERS column).` : "";
  const failed = runs.some((run) => run.state === "failed") ? `\nRun the same replicate again to retry; copies resume from the bytes already on disk.` : "";
  return `Replicating ${model}/${version}:\n${lines.join("\n")}${follow}${failed}`;
}
