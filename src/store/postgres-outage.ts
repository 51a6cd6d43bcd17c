// Whether PostgreSQL answers, as this server sees it, so that nothing waits on a database
// that is down. Every storage fault of the store passes here (fault-naming-dialect.ts,
// Store.nameFault); a probe (a `select 1`, or the probe write while a fault is recorded,
// within POSTGRES_DEADLINES.probeMs) decides:
// - "up": queries go ahead;
// - "doubt": a connection was dropped or refused; a probe runs now, and queries wait for
//   its answer (at most the probe's deadline) rather than each finding out alone;
// - "down": a probe failed, or a query or connect met silence past its deadline (a
//   partition, a machine gone): queries fail at once with 503 `storage_unavailable`, and a
//   probe runs every second until one succeeds (faults told meanwhile start none).
// The probe runs on a connection of its own, outside the pool: a query that waited in vain
// for a free pooled connection ("busy") says the pool is full, not that the database is
// down, and neither moves the gate nor keeps the probe from answering.
// /readyz asks `check()`, which probes at most once a second even when all looks well, so
// a database that went silent between queries is seen within the probe's deadline.
import { isSilentFault, StorageUnavailableError, type StorageHealth } from "./storage-fault.ts";

export type Reachability = "up" | "doubt" | "down";

/** How often a database that is down is probed, and at most how often /readyz probes. */
export const PROBE_INTERVAL_MS = 1_000;

export interface OutageGateOptions {
  /** One probe within its deadline; throws the storage fault it met (named), or anything else. */
  probe: (faulted: boolean) => Promise<void>;
  health: StorageHealth;
  clock?: () => number;
}

export class OutageGate {
  private state: Reachability = "up";
  /** The fault that put the store down, thrown again (fresh) at every query while it is. */
  private lastFault: StorageUnavailableError | null = null;
  private probing: Promise<void> | null = null;
  private lastProbeAt = 0;
  private timer: NodeJS.Timeout | undefined;
  private closed = false;
  private readonly clock: () => number;

  constructor(private readonly options: OutageGateOptions) {
    this.clock = options.clock ?? Date.now;
  }

  get reachability(): Reachability {
    return this.state;
  }

  /** Before a query takes a connection: resolves when it may go ahead, throws the outage's fault when not. */
  async admit(): Promise<void> {
    if (this.state === "doubt") await this.probing;
    if (this.state === "down" && this.lastFault !== null) {
      const fault = this.lastFault;
      throw new StorageUnavailableError({ where: fault.where, kind: fault.kind, faultCode: fault.faultCode, cause: fault.cause });
    }
  }

  /**
   * A storage fault a query met. Connection faults put the store in doubt (or down, after
   * silence) and start a probe; while it is down already, the probe every second is the
   * one that tells (usage flushes and drains name their faults here however often they run).
   */
  observe(fault: StorageUnavailableError): void {
    if (this.closed || fault.kind !== "unreachable") return;
    this.lastFault = fault;
    if (this.state === "down") return;
    if (isSilentFault(fault)) this.state = "down";
    else if (this.state === "up") this.state = "doubt";
    this.startProbe();
  }

  /**
   * For /readyz: a probe when none ran in the last second (one at a time), then the state
   * it left. While the database is known to be down the answer is that, at once: the
   * probes that will see it back run every second anyway.
   */
  async check(): Promise<Reachability> {
    if (this.state === "down") return this.state;
    if (this.probing === null && this.clock() - this.lastProbeAt >= PROBE_INTERVAL_MS) this.startProbe();
    await this.probing;
    return this.state;
  }

  close(): void {
    this.closed = true;
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
  }

  private startProbe(): void {
    if (this.probing !== null || this.closed) return;
    this.lastProbeAt = this.clock();
    this.probing = this.probeOnce().finally(() => {
      this.probing = null;
      if (this.state === "down") this.scheduleProbe();
    });
  }

  private async probeOnce(): Promise<void> {
    try {
      await this.options.probe(this.options.health.fault() !== null);
      this.state = "up";
      this.lastFault = null;
      this.options.health.clear();
    } catch (error) {
      if (error instanceof StorageUnavailableError) {
        this.options.health.noteFault(error);
        if (error.kind === "unreachable") {
          this.lastFault = error;
          this.state = "down";
          return;
        }
      }
      // The database answered (a full disk, a read-only database, a bug in the probe): it
      // is reachable, and queries meet whatever fault there is themselves.
      this.state = "up";
      this.lastFault = null;
    }
  }

  private scheduleProbe(): void {
    if (this.timer !== undefined || this.closed) return;
    const wait = Math.max(0, this.lastProbeAt + PROBE_INTERVAL_MS - this.clock());
    this.timer = setTimeout(() => {
      this.timer = undefined;
      if (this.state === "down") this.startProbe();
    }, wait);
    this.timer.unref();
  }
}
