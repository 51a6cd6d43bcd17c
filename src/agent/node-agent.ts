// The node agent: runs what the fleet assigns to this node and reports how it goes. It
// long-polls its assignments (so it works behind NAT: it only ever calls the server),
// starts an EngineSupervisor for each new assignment and stops the ones no longer
// assigned, and heartbeats its inventory and every replica's state: on a timer, and at
// once when a replica changes state (a replica that became ready is routable a moment
// later, not a heartbeat later). It decides nothing about placement; `llmgw agent` runs it
// against the server over HTTP, `llmgw up` against the in-process fleet (DESIGN.md "The
// fleet seam").
import { describeError, LlmgwError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import type { Assignment, Assignments, HeartbeatReport, ReplicaReport, ReportedState } from "../fleet/agent-protocol.ts";
import type { NodeInventory, NodeLabels } from "../fleet/fleet-types.ts";
import { abortableDelay } from "./engine-health.ts";
import { EngineSupervisor, pruneRunFolders, type EngineLaunch, type SupervisorOptions, type SupervisorSnapshot } from "./engine-supervisor.ts";

/** Where a replica's weights are on this node, fetched and checked as needed. */
export interface WeightsProvider {
  /**
   * The absolute path of the file the engine loads (the first of `assignment.files`), after
   * the files are present and pass the identity check. Throws with the reason otherwise.
   */
  prepare(assignment: Assignment, signal: AbortSignal): Promise<{ path: string; verified: boolean }>;
  /** weightsKeys of what this node holds now (placement prefers such nodes). */
  held?(): string[];
}

/** Builds the engine command for one attempt of an assignment (the engine adapters). */
export type LaunchBuilder = (input: { assignment: Assignment; weightsPath: string; host: string; port: number; attempt: number; stateDir: string }) => EngineLaunch;

export type SupervisorTimings = Partial<Pick<SupervisorOptions, "readyTimeoutMs" | "healthIntervalMs" | "stopGraceMs" | "backoff" | "parkAfter" | "livenessIntervalMs">>;

/** Restart delay min(10·2^(n−1), 300) s, as GPUStack does (reference/engines.md). */
export const AGENT_BACKOFF = { initialMs: 10_000, maxMs: 300_000 } as const;

export interface NodeAgentOptions {
  assignments: Assignments;
  credential: string;
  name: string;
  /** Where the gateway reaches this node's engines; engines bind to it. */
  address: string;
  inventory: NodeInventory;
  labels: NodeLabels;
  /** Engine run folders go below this. */
  stateRoot: string;
  weights: WeightsProvider;
  launch: LaunchBuilder;
  logger: Logger;
  supervisor?: SupervisorTimings;
  /** How long one assignments poll may wait on the server. Default 25 s. */
  pollWaitMs?: number;
  /**
   * Called once when the server says this node no longer exists (it was removed, or the
   * credential is unknown there): the agent has stopped its engines by then, since nobody
   * routes to them or tells it what to run. `llmgw agent` exits with the reason.
   */
  onDismissed?: (error: LlmgwError) => void;
}

/** Refusals that mean this node is no longer part of the fleet (not a passing fault). */
const DISMISSED = new Set(["node_removed", "invalid_node_credential"]);

interface Running {
  assignment: Assignment;
  supervisor: EngineSupervisor;
  fetching: boolean;
  weightsVerified: boolean;
  stopping: boolean;
  unsubscribe: () => void;
}

const DEFAULT_POLL_WAIT_MS = 25_000;
const DEFAULT_HEARTBEAT_MS = 5_000;

export class NodeAgent {
  private readonly running = new Map<string, Running>();
  private readonly controller = new AbortController();
  private knownVersion: string | null = null;
  private heartbeatMs = DEFAULT_HEARTBEAT_MS;
  private heartbeatTimer: NodeJS.Timeout | undefined;
  private heartbeatSoon: NodeJS.Timeout | undefined;
  private heartbeating: Promise<void> = Promise.resolve();
  private pollLoop: Promise<void> = Promise.resolve();
  private started = false;

  constructor(private readonly options: NodeAgentOptions) {}

  start(): void {
    if (this.started) return;
    this.started = true;
    void pruneRunFolders({ stateRoot: this.options.stateRoot, logger: this.options.logger }).catch((error: unknown) =>
      this.options.logger.warn({ err: describeError(error) }, "could not prune old engine run folders"),
    );
    this.scheduleHeartbeat(0);
    this.pollLoop = this.poll();
  }

  /** Stops polling and every engine (SIGTERM to each group, SIGKILL after the grace). */
  async stop(): Promise<void> {
    this.controller.abort();
    clearTimeout(this.heartbeatTimer);
    clearTimeout(this.heartbeatSoon);
    await this.pollLoop;
    await Promise.all([...this.running.values()].map((replica) => this.retire(replica)));
    await this.heartbeating;
  }

  /** The engine processes this agent runs now (diagnostics and tests). */
  engineProcesses(): Array<{ replicaId: string; modelName: string; pid: number }> {
    return [...this.running.values()].flatMap((replica) => {
      const pid = replica.supervisor.snapshot().pid;
      return pid === null ? [] : [{ replicaId: replica.assignment.replicaId, modelName: replica.assignment.modelName, pid }];
    });
  }

  private async poll(): Promise<void> {
    const signal = this.controller.signal;
    let failures = 0;
    while (!signal.aborted) {
      try {
        const set = await this.options.assignments.assignments(this.options.credential, {
          knownVersion: this.knownVersion,
          waitMs: this.options.pollWaitMs ?? DEFAULT_POLL_WAIT_MS,
          signal,
        });
        failures = 0;
        if (signal.aborted) return;
        this.knownVersion = set.version;
        await this.apply(set.assignments);
      } catch (error) {
        if (signal.aborted) return;
        failures += 1;
        if (error instanceof LlmgwError && DISMISSED.has(error.code)) {
          this.options.logger.error({ err: describeError(error) }, "the server no longer knows this node; stopping its engines");
          await Promise.all([...this.running.values()].map((replica) => this.retire(replica)));
          this.options.onDismissed?.(error);
          return;
        }
        const refused = error instanceof LlmgwError && (error.status === 401 || error.status === 403);
        // A refused credential will not heal by itself: say so loudly, and retry slowly in
        // case an operator fixes the server side.
        if (refused) this.options.logger.error({ err: describeError(error) }, "the server refused this node's credential");
        else this.options.logger.warn({ err: describeError(error), failures }, "could not fetch assignments; retrying");
        await abortableDelay(refused ? 10_000 : Math.min(10_000, 500 * 2 ** Math.min(failures, 5)), signal);
      }
    }
  }

  private async apply(assignments: readonly Assignment[]): Promise<void> {
    const wanted = new Map(assignments.map((a) => [a.replicaId, a]));
    const retiring: Promise<void>[] = [];
    for (const [id, replica] of this.running) {
      if (!wanted.has(id) && !replica.stopping) retiring.push(this.retire(replica));
    }
    for (const assignment of assignments) {
      if (!this.running.has(assignment.replicaId)) this.launch(assignment);
    }
    this.requestHeartbeat();
    // Stops run in the background: a slow engine stop must not delay new assignments.
    void Promise.all(retiring).then(() => this.requestHeartbeat());
  }

  private launch(assignment: Assignment): void {
    const { logger } = this.options;
    const host = this.options.address;
    let weightsPath: string | null = null;
    const running: Running = {
      assignment,
      fetching: false,
      weightsVerified: false,
      stopping: false,
      unsubscribe: () => {},
      supervisor: new EngineSupervisor({
        replicaId: assignment.replicaId,
        stateRoot: this.options.stateRoot,
        host,
        logger,
        backoff: AGENT_BACKOFF,
        ...this.options.supervisor,
        preflight: async (signal) => {
          // Before every attempt: the weights are present and are what the server published.
          running.fetching = true;
          running.weightsVerified = false;
          this.requestHeartbeat();
          try {
            const prepared = await this.options.weights.prepare(assignment, signal);
            weightsPath = prepared.path;
            running.weightsVerified = prepared.verified;
          } finally {
            running.fetching = false;
            this.requestHeartbeat();
          }
        },
        prepare: ({ port, attempt, stateDir }) => this.options.launch({ assignment, weightsPath: weightsPath!, host, port, attempt, stateDir }),
      }),
    };
    running.unsubscribe = running.supervisor.onChange(() => this.requestHeartbeat());
    this.running.set(assignment.replicaId, running);
    running.supervisor.start();
    logger.info({ model: assignment.modelName, replica: assignment.replicaId }, "starting replica");
  }

  private async retire(replica: Running): Promise<void> {
    if (replica.stopping) return;
    replica.stopping = true;
    this.options.logger.info({ model: replica.assignment.modelName, replica: replica.assignment.replicaId }, "stopping replica");
    await replica.supervisor.stop();
    replica.unsubscribe();
    this.running.delete(replica.assignment.replicaId);
  }

  // --- Heartbeats ------------------------------------------------------------------------

  /** A heartbeat soon (coalescing the bursts of changes a start makes). */
  private requestHeartbeat(): void {
    if (this.controller.signal.aborted || this.heartbeatSoon !== undefined) return;
    this.heartbeatSoon = setTimeout(() => {
      this.heartbeatSoon = undefined;
      this.scheduleHeartbeat(0);
    }, 20);
  }

  private scheduleHeartbeat(delayMs: number): void {
    clearTimeout(this.heartbeatTimer);
    if (this.controller.signal.aborted) return;
    this.heartbeatTimer = setTimeout(() => {
      this.heartbeating = this.heartbeating.then(() => this.beat());
    }, delayMs);
  }

  private async beat(): Promise<void> {
    if (this.controller.signal.aborted) return;
    try {
      const reply = await this.options.assignments.heartbeat(this.options.credential, this.report());
      this.heartbeatMs = reply.heartbeatIntervalMs;
    } catch (error) {
      this.options.logger.warn({ err: describeError(error) }, "heartbeat failed");
    }
    this.scheduleHeartbeat(this.heartbeatMs);
  }

  private report(): HeartbeatReport {
    return {
      name: this.options.name,
      address: this.options.address,
      inventory: this.options.inventory,
      labels: this.options.labels,
      replicas: [...this.running.values()].map((replica) => reportOf(replica)),
      cached: this.options.weights.held?.() ?? [],
    };
  }
}

function reportOf(replica: Running): ReplicaReport {
  const snapshot: SupervisorSnapshot = replica.supervisor.snapshot();
  const state: ReportedState = replica.fetching && snapshot.state === "starting" ? "fetching" : snapshot.state;
  return {
    id: replica.assignment.replicaId,
    state,
    endpoint: snapshot.endpoint,
    attempt: snapshot.attempt,
    failures: snapshot.failures,
    lastError: snapshot.lastError,
    lastErrorCode: snapshot.lastErrorCode,
    startedAt: snapshot.startedAt,
    readyAt: snapshot.readyAt,
    weightsVerified: replica.weightsVerified,
  };
}
