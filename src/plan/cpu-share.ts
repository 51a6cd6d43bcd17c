// How much of a CPU core one replica reserves on its node when its profile does not say:
// a profile's `hardware.cpu.cores` (which a serve request's `hardware.cpu.cores` sets) is
// an exact request and wins. The fleet places by this share (fleet/replica-needs.ts) and
// the planner shows it (`ctl model plan`), so both state one rule; DESIGN.md "Replica
// lifecycle" has it in words.
//
// The rule: one core per CORE_SHARE_BYTES of the replica's memory (weights + KV cache +
// buffers, the estimate placement already uses), rounded up to a quarter, at least a
// quarter and at most one core.
// - Why size: token generation on a CPU is bound by memory bandwidth. Every token reads
//   all the weights and the KV cache in use, so the work a replica brings to its cores
//   grows with its bytes; a 30 MB model is a small fraction of what a 5 GB one asks.
// - Why 2 GiB a core: it keeps the old rule's whole core for every replica above 1.5 GiB
//   (a 1B model at Q4 with the default 16k context pool, and anything larger, where one
//   core is already slow), gives half a core to replicas of 0.5 to 1 GiB (a 0.5B model
//   at Q4, or a 135M one with the default pool's 360 MiB of KV cache) and a quarter to
//   the tiny ones (the `up --demo` model needs about 30 MiB). So a 2-core machine holds
//   the demo and three models of under 100 MB of weights at once (0.25 + 3 × 0.5 cores).
// - Why quarters: a quarter is the smallest share that still means something on a node of
//   two cores, and multiples of 0.25 are exact in binary floating point, so sums of
//   requests compare with a node's cores without rounding drift.
// - Why at most one: a replica of a big model asked for one core before this rule, and
//   an operator who wants more for it says so with hardware.cpu.cores.
// The share is a reservation for placement, not a limit: the engine's threads still run
// on every core (engine-launch.ts), so a lone replica uses the whole machine.

const GiB = 1024 ** 3;

/** Memory that counts as one whole core of work. */
export const CORE_SHARE_BYTES = 2 * GiB;
/** Shares are whole quarters of a core. */
export const CORE_SHARE_STEP = 0.25;
/** The least a replica reserves. */
export const MIN_CORE_SHARE = CORE_SHARE_STEP;
/** The most a replica reserves without an explicit request. */
export const MAX_CORE_SHARE = 1;

/** The cores a CPU replica needing `memoryBytes` reserves when its profile does not set them. */
export function cpuCoreShare(memoryBytes: number): number {
  const quarters = Math.ceil(Math.max(0, memoryBytes) / (CORE_SHARE_BYTES * CORE_SHARE_STEP));
  return Math.min(MAX_CORE_SHARE, Math.max(MIN_CORE_SHARE, quarters * CORE_SHARE_STEP));
}

/** Cores for people: "2", "0.5", "1.75"; never a float's tail ("0.30000000000000004"). */
export function formatCores(cores: number): string {
  return String(Math.round(cores * 100) / 100);
}

/** The rule in one sentence, as `ctl model plan` prints it. */
export const CORE_SHARE_RULE = `A CPU replica reserves one core per ${CORE_SHARE_BYTES / GiB} GiB of its memory, rounded up to a quarter, from ${MIN_CORE_SHARE} to ${MAX_CORE_SHARE} core, unless its profile sets hardware.cpu.cores (then exactly that).`;
