// Bringing a version's mirrored bytes onto this server for a job step that reads them (the
// check step reads the GGUF header, or config.json, as the engine will). In a cluster the
// server running a job may not hold them: a job resumed here after the server that ran it
// died finds them held by that server only. Such a step does not fail on that. It copies
// them here from a running holder that answers (Mirror.replicate), else from their origin
// (Mirror.fromOrigin: the registry's URL with its token, checked against the same sha256),
// saying in the step's detail how far the copy got, and then this server holds them too.
//
// A holder that does not answer costs at most HOLDER_STALL_MS: a killed server still counts
// as running for a few seconds after its last heartbeat, and a host that vanished answers
// nothing at all. The origin is tried next; a failed origin copy is tried again when its
// retry time comes. The step fails only when no copy can be had at all (no running holder,
// and no origin another server can read: a local-file source) or when nothing moved for
// GIVE_UP_AFTER_MS, each with what to do.
import { UpstreamError, describeError } from "../core/errors.ts";
import { clause, countOf, formatBytes } from "../core/format.ts";
import type { Mirror, MirrorHolder, MirrorProgressEvent, ReplicateSummary } from "../mirror/mirror.ts";
import { describeOriginCopy } from "../mirror/origin-copies.ts";
import type { StepHandle } from "./jobs.ts";

/** How long a copy from a holder may go without a byte before the origin is tried instead. */
export const HOLDER_STALL_MS = 10_000;
/** How long the step keeps trying while no copy moves a byte (holders down, origin failing). */
export const GIVE_UP_AFTER_MS = 5 * 60_000;

export interface MirroredHereInput {
  mirror: Pick<Mirror, "check" | "replicate" | "fromOrigin">;
  model: string;
  version: string;
  files: readonly string[];
  signal: AbortSignal;
  /** Where the copy's progress goes while it runs. */
  step?: StepHandle | undefined;
  holderStallMs?: number;
  giveUpAfterMs?: number;
  /** How often an origin copy's progress is read. Default 500 ms. */
  pollMs?: number;
  clock?: () => number;
}

/** A file this server does not hold, and who does. */
interface Away {
  file: string;
  holders: MirrorHolder[];
  server: string;
}

/**
 * Makes every file of `files` that another server holds (check: `elsewhere`) held here too.
 * Resolves with a note for the step's detail (null when nothing had to be copied); throws
 * when no copy can be had, or the abort reason. Files the mirror refuses are left to the
 * caller's check, which names why.
 */
export async function bringMirroredHere(input: MirroredHereInput): Promise<string | null> {
  const clock = input.clock ?? Date.now;
  const giveUpAfterMs = input.giveUpAfterMs ?? GIVE_UP_AFTER_MS;
  const sources = new Set<string>();
  let copiedFiles = 0;
  let lastMoved = clock();
  const moved = () => {
    lastMoved = clock();
  };
  for (;;) {
    input.signal.throwIfAborted();
    const away = await filesAway(input);
    if (away.length === 0) return copiedFiles === 0 ? null : `${countOf(copiedFiles, "file")} copied here from ${[...sources].join(" and ")}`;
    copiedFiles = Math.max(copiedFiles, away.length);
    const reasons: string[] = [];
    const holders = liveHolders(away);
    if (holders.length > 0) {
      const failure = await copyFromHolder(input, holders, moved);
      if (failure === null) {
        sources.add(`server '${holders[0]!.name}'`);
        continue;
      }
      reasons.push(failure);
    }
    const fromOrigin = await copyFromOrigin(input, await filesAway(input), moved, reasons);
    if (fromOrigin.from !== null) sources.add(`the origin (${fromOrigin.from})`);
    if (fromOrigin.done) continue;
    if (holders.length === 0 && fromOrigin.none) {
      const named = away.map((file) => `'${file.file}' (held by ${describeList(file.holders)})`).join(", ");
      throw new UpstreamError(
        `${named} of ${input.model}/${input.version} is not on this server ('${away[0]!.server}'), and no server that holds it is running: ${reasons.map(clause).join("; ")}. ` +
          "Start a server that holds it, then run the job again.",
        { code: "mirror_holders_down" },
      );
    }
    if (clock() - lastMoved > giveUpAfterMs) {
      throw new UpstreamError(
        `No copy of ${away.map((file) => `'${file.file}'`).join(", ")} of ${input.model}/${input.version} reached this server in ${Math.round(giveUpAfterMs / 1000)} s: ${reasons.map(clause).join("; ")}. ` +
          "Start a server that holds it or make its origin reachable, then run the job again.",
        { code: "mirror_copy_stalled" },
      );
    }
    // A holder that still counts as running, or an origin that failed: try again in a moment.
    input.step?.detail(`waiting to copy the weights here: ${reasons.map(clause).join("; ")}`);
    await waitFor(fromOrigin.retryAt === null ? 2_000 : Math.max(500, fromOrigin.retryAt - clock()), input.signal);
  }
}

async function filesAway(input: MirroredHereInput): Promise<Away[]> {
  const away: Away[] = [];
  for (const file of input.files) {
    const checked = await input.mirror.check(input.model, input.version, file);
    if (checked.kind === "elsewhere") away.push({ file, holders: checked.holders, server: checked.server });
  }
  return away;
}

function liveHolders(away: readonly Away[]): MirrorHolder[] {
  const server = away[0]?.server;
  const live = away.flatMap((file) => file.holders).filter((holder) => holder.live && holder.url !== "" && holder.name !== server);
  return [...new Map(live.map((holder) => [holder.name, holder])).values()].sort((a, b) => a.name.localeCompare(b.name));
}

function describeList(holders: readonly MirrorHolder[]): string {
  return holders.map((holder) => `'${holder.name}'${holder.live ? "" : " (not running)"}`).join(", ");
}

/**
 * Copies the version's files here from the first running holder (Mirror.replicate picks
 * it the same way); null when every file is here, else why not. Aborted when no byte came
 * for `holderStallMs`.
 */
async function copyFromHolder(input: MirroredHereInput, holders: readonly MirrorHolder[], moved: () => void): Promise<string | null> {
  const stallMs = input.holderStallMs ?? HOLDER_STALL_MS;
  const holder = holders[0]!.name;
  const stall = new AbortController();
  let timer: NodeJS.Timeout | undefined;
  const arm = () => {
    clearTimeout(timer);
    timer = setTimeout(() => stall.abort(new Error(`'${holder}' sent nothing for ${Math.round(stallMs / 1000)} s`)), stallMs);
  };
  arm();
  const done = new Map<string, number>();
  input.step?.detail(`copying the weights here from server '${holder}' (this server does not hold them)`);
  try {
    const summary: ReplicateSummary = await input.mirror.replicate(input.model, input.version, {
      signal: AbortSignal.any([input.signal, stall.signal]),
      onProgress: (event: MirrorProgressEvent) => {
        if (event.bytesDone > (done.get(event.file) ?? 0)) {
          moved();
          arm();
        }
        done.set(event.file, event.bytesDone);
        const total = event.bytesTotal === null ? "" : ` of ${formatBytes(event.bytesTotal)}`;
        input.step?.detail(`copying ${event.file} here from server '${holder}': ${formatBytes(event.bytesDone)}${total}`);
      },
    });
    const failed = summary.files.filter((file) => file.state === "failed");
    if (failed.length === 0) return null;
    return `copying from server '${holder}' failed (${failed.map((file) => `${file.file}: ${clause(file.error?.message ?? "no reason given")}`).join("; ")})`;
  } catch (error) {
    if (input.signal.aborted) throw input.signal.reason;
    return `copying from server '${holder}' failed (${clause(describeError(stall.signal.aborted ? stall.signal.reason : error))})`;
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Has the mirror copy each file from its origin (in the background: nodes asking for the
 * file share that copy) and waits while the copies run. `done` once every file is here;
 * else the reasons are added to `reasons`, `none` says no file had an origin to copy from,
 * `retryAt` when a failed copy may be tried again.
 */
async function copyFromOrigin(
  input: MirroredHereInput,
  away: readonly Away[],
  moved: () => void,
  reasons: string[],
): Promise<{ done: boolean; none: boolean; retryAt: number | null; from: string | null }> {
  const bytes = new Map<string, number>();
  let from: string | null = null;
  for (let left = [...away]; ; ) {
    input.signal.throwIfAborted();
    const still: Away[] = [];
    let fetching = false;
    let none = true;
    let retryAt: number | null = null;
    const why: string[] = [];
    for (const file of left) {
      if ((await input.mirror.check(input.model, input.version, file.file)).kind !== "elsewhere") continue;
      still.push(file);
      const copy = await input.mirror.fromOrigin(input.model, input.version, file.file);
      if (copy.state !== "none") none = false;
      if (copy.state === "fetching") {
        from = copy.from;
        fetching = true;
        if (copy.bytesDone > (bytes.get(file.file) ?? 0)) moved();
        bytes.set(file.file, copy.bytesDone);
        input.step?.detail(`copying ${file.file} here: no running server that holds it answered. ${describeOriginCopy(copy)}`);
      } else if (copy.state === "failed") {
        why.push(`fetching ${file.file} from its origin (${copy.from}) failed: ${clause(copy.error.message)}`);
        retryAt = Math.min(retryAt ?? copy.retryAt, copy.retryAt);
      } else {
        why.push(`${file.file} has no origin to fetch it from: ${copy.why}`);
      }
    }
    if (still.length === 0) return { done: true, none: false, retryAt: null, from };
    if (!fetching) {
      reasons.push(...why);
      return { done: false, none, retryAt, from };
    }
    left = still;
    await waitFor(input.pollMs ?? 500, input.signal);
  }
}

function waitFor(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      signal.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal.reason);
    };
    signal.addEventListener("abort", onAbort, { once: true });
  });
}
