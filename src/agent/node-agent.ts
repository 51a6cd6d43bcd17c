// The node agent: runs what the fleet assigns to this node and reports how it goes. It
// long-polls its assignments (so it works behind NAT: it only ever calls the server),
// starts an EngineSupervisor for each new assignment and stops the ones no longer
// assigned, and heartbeats its inventory and every replica's state: on a timer, and at
// once when a replica changes state (a replica that became ready is routable a moment
// later, not a heartbeat later). It decides nothing about placement; `llmgw agent` runs it
// against the server over HTTP, `llmgw up` against the in-process fleet (DESIGN.md "The
// fleet seam").
import { randomBytes } from "node:crypto";
import { backoffDelay, type BackoffPolicy } from "../core/backoff.ts";
import { describeError, LlmgwError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import type { Assignment, Assignments, HeartbeatReport, ReplicaReport, ReportedState } from "../fleet/agent-protocol.ts";
import type { NodeInventory, NodeLabels } from "../fleet/fleet-types.ts";
import { abortableDelay } from "./engine-health.ts";
import { EngineSupervisor, pruneRunFolders, type EngineLaunch, type SupervisorOptions, type SupervisorSnapshot } from "./engine-supervisor.ts";
import { findFreePort } from "./free-port.ts";
import { prepareWaitingForWeights } from "./weights-wait.ts";
import { formatHost } from "../core/format.ts";

/** Where a replica's weights are on this node, fetched and checked as needed. */
export interface PreparedWeights {
  path: string;
  verified: boolean;
  /** The vision projector (source.projector), present and checked like the weights. */
  projectorPath?: string;
  /** The adapters' paths, in the model's order (their ids), present and checked like the weights. */
  adapterPaths?: string[];
}

export interface WeightsProvider {
  /**
   * The absolute path of the file the engine loads (the first of `assignment.files`), after
   * the files are present and pass the identity check. Throws with the reason otherwise: a
   * `WeightsUnavailableError` (weights-wait.ts) when they cannot be had right now, which the
   * agent waits out instead of counting it against the engine.
   */
  prepare(assignment: Assignment, signal: AbortSignal): Promise<PreparedWeights>;
  /** weightsKeys of what this node holds now (placement prefers such nodes). */
  held?(): string[];
}

/**
 * Builds the command for one attempt of an assignment (the engine adapters). `part` is the
 * engine itself, or for a vLLM replica over several nodes the Ray head (on the head node,
 * its GCS on `rayAddress`) or a Ray worker (joining `rayAddress`).
 */
export type LaunchBuilder = (input: {
  assignment: Assignment;
  part: "engine" | "ray-head" | "ray-worker";
  weightsPath: string;
  /** The vision projector beside the weights, when the model has one. */
  projectorPath?: string;
  /** The adapters' paths, in the model's order, when it has any. */
  adapterPaths?: string[];
  host: string;
  port: number;
  attempt: number;
  stateDir: string;
  rayAddress?: string;
}) => EngineLaunch | Promise<EngineLaunch>;

export type SupervisorTimings = Partial<
  Pick<SupervisorOptions, "readyTimeoutMs" | "healthIntervalMs" | "stopGraceMs" | "backoff" | "parkAfter" | "livenessIntervalMs">
>;

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
  /** How long to wait between tries while a replica's weights cannot be had right now. Default WEIGHTS_WAIT_BACKOFF. */
  weightsWait?: BackoffPolicy;
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
  /** The newest assignment of the replica (a head learns from it when its workers are ready). */
  assignment: Assignment;
  /** The engine (or on a worker node, the Ray worker); a head's starts once its workers joined. */
  supervisor: EngineSupervisor | null;
  /** On a head node: the Ray head, started first, with its GCS at `rayAddress`. */
  rayHead: EngineSupervisor | null;
  rayAddress: string | null;
  fetching: boolean;
  weightsVerified: boolean;
  stopping: boolean;
  unsubscribers: Array<() => void>;
}

const DEFAULT_POLL_WAIT_MS = 25_000;
const DEFAULT_HEARTBEAT_MS = 5_000;
/** Failed polls wait 1 s, then twice as long each time up to 10 s: a server back from a restart hears from its nodes within seconds. */
const POLL_BACKOFF = { baseMs: 1_000, maxMs: 10_000 };
/** A refused credential waits the longest poll backoff every time: it heals only when an operator acts. */
const REFUSED_POLL_DELAY_MS = POLL_BACKOFF.maxMs;
/** While the server refuses this node's address, the refusal is logged again this often (not on every heartbeat). */
const ADDRESS_REFUSAL_LOG_MS = 60_000;

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
  /** This start of the agent, so the server knows the engines of an earlier one are gone. */
  private readonly run = randomBytes(6).toString("hex");
  /** The server's refusal of this node's address, while it lasts: what it said and when it was last logged. */
  private addressRefusal: { message: string; loggedAt: number } | null = null;

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

  /**
   * Stops polling and every engine (SIGTERM to each group, SIGKILL after the grace), then
   * tells the server they stopped, so it routes nothing to them while this node is away
   * (they are placed elsewhere only if it stays away past the node timeout).
   */
  async stop(): Promise<void> {
    this.controller.abort();
    clearTimeout(this.heartbeatTimer);
    clearTimeout(this.heartbeatSoon);
    await this.pollLoop;
    const replicas = [...this.running.values()];
    await Promise.all(replicas.map((replica) => this.retire(replica)));
    await this.heartbeating;
    if (replicas.length === 0) return;
    try {
      await this.options.assignments.heartbeat(this.options.credential, {
        ...this.report(),
        replicas: replicas.map((replica) => ({ ...reportOf(replica), state: "stopped" as const, endpoint: null, readyAt: null })),
      });
    } catch (error) {
      this.options.logger.warn({ err: describeError(error) }, "could not tell the server the engines stopped");
    }
  }

  /** The engine processes this agent runs now (diagnostics and tests). */
  engineProcesses(): Array<{ replicaId: string; modelName: string; pid: number }> {
    return [...this.running.values()].flatMap((replica) =>
      [replica.supervisor, replica.rayHead].flatMap((supervisor) => {
        const pid = supervisor?.snapshot().pid ?? null;
        return pid === null ? [] : [{ replicaId: replica.assignment.replicaId, modelName: replica.assignment.modelName, pid }];
      }),
    );
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
        await abortableDelay(refused ? REFUSED_POLL_DELAY_MS : backoffDelay(failures, POLL_BACKOFF), signal);
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
      const running = this.running.get(assignment.replicaId);
      if (running?.stopping === true) continue;
      if (running !== undefined) running.assignment = assignment;
      const ray = assignment.ray;
      if (ray?.role === "worker") {
        // A head that restarted has a new address: the worker joins that one.
        if (running !== undefined && running.rayAddress !== ray.headAddress) {
          const headAddress = ray.headAddress;
          retiring.push(
            this.retire(running).then(() => {
              // A poll in between may have started it already.
              if (headAddress !== null && !this.controller.signal.aborted && !this.running.has(assignment.replicaId))
                this.launch(assignment, { part: "ray-worker", rayAddress: headAddress });
            }),
          );
        } else if (running === undefined && ray.headAddress !== null) this.launch(assignment, { part: "ray-worker", rayAddress: ray.headAddress });
      } else if (ray?.role === "head") {
        if (running === undefined) await this.launchRayHead(assignment);
        else this.startHeadEngine(running);
      } else if (running === undefined) {
        this.launch(assignment, { part: "engine" });
      }
    }
    this.requestHeartbeat();
    // Stops run in the background: a slow engine stop must not delay new assignments.
    void Promise.all(retiring).then(() => this.requestHeartbeat());
  }

  /** Starts the supervisor of a replica's engine (or Ray worker) on this node. */
  private launch(assignment: Assignment, options: { part: "engine" | "ray-worker"; rayAddress?: string }, existing?: Running): void {
    const running: Running = existing ?? {
      assignment,
      supervisor: null,
      rayHead: null,
      rayAddress: options.rayAddress ?? null,
      fetching: false,
      weightsVerified: false,
      stopping: false,
      unsubscribers: [],
    };
    let weightsPath: string | null = null;
    let projectorPath: string | undefined;
    let adapterPaths: string[] | undefined;
    const supervisor = this.supervisor(assignment.replicaId, {
      preflight: async (signal, notes) => {
        // Before every attempt: the weights are present and are what the server published.
        // Weights no server can send right now are waited for, not counted as a failure of
        // the engine (weights-wait.ts).
        running.fetching = true;
        running.weightsVerified = false;
        this.requestHeartbeat();
        try {
          const prepared = await prepareWaitingForWeights({
            prepare: () => this.options.weights.prepare(running.assignment, signal),
            signal,
            waiting: (note) => notes.waiting(note),
            logger: this.options.logger.child({ replicaId: assignment.replicaId }),
            ...(this.options.weightsWait === undefined ? {} : { backoff: this.options.weightsWait }),
          });
          weightsPath = prepared.path;
          projectorPath = prepared.projectorPath;
          adapterPaths = prepared.adapterPaths;
          running.weightsVerified = prepared.verified;
        } finally {
          running.fetching = false;
          this.requestHeartbeat();
        }
      },
      prepare: ({ port, attempt, stateDir }) =>
        this.options.launch({
          assignment: running.assignment,
          part: options.part,
          weightsPath: weightsPath!,
          ...(projectorPath === undefined ? {} : { projectorPath }),
          ...(adapterPaths === undefined ? {} : { adapterPaths }),
          host: this.options.address,
          port,
          attempt,
          stateDir,
          ...(options.rayAddress === undefined ? {} : { rayAddress: options.rayAddress }),
        }),
    });
    running.supervisor = supervisor;
    running.unsubscribers.push(supervisor.onChange(() => this.requestHeartbeat()));
    this.running.set(assignment.replicaId, running);
    supervisor.start();
    this.options.logger.info({ model: assignment.modelName, replica: assignment.replicaId, part: options.part }, "starting replica");
  }

  /** A head node first runs the Ray head; its engine starts once the workers joined (startHeadEngine). */
  private async launchRayHead(assignment: Assignment): Promise<void> {
    const gcsPort = await findFreePort(this.options.address);
    const running: Running = {
      assignment,
      supervisor: null,
      rayHead: null,
      rayAddress: `${formatHost(this.options.address)}:${gcsPort}`,
      fetching: false,
      weightsVerified: false,
      stopping: false,
      unsubscribers: [],
    };
    const rayHead = this.supervisor(`${assignment.replicaId}-ray`, {
      prepare: ({ port, attempt, stateDir }) =>
        this.options.launch({
          assignment: running.assignment,
          part: "ray-head",
          weightsPath: "",
          host: this.options.address,
          port,
          attempt,
          stateDir,
          rayAddress: running.rayAddress!,
        }),
    });
    running.rayHead = rayHead;
    running.unsubscribers.push(
      rayHead.onChange(() => {
        this.startHeadEngine(running);
        this.requestHeartbeat();
      }),
    );
    this.running.set(assignment.replicaId, running);
    rayHead.start();
    this.options.logger.info(
      { model: assignment.modelName, replica: assignment.replicaId, rayAddress: running.rayAddress },
      "starting the Ray head of a replica over several nodes",
    );
  }

  /** vLLM on the head, once its Ray head is up and every worker joined it. */
  private startHeadEngine(running: Running): void {
    if (running.stopping || running.supervisor !== null || running.rayHead?.snapshot().state !== "ready" || running.assignment.ray?.workersReady !== true)
      return;
    this.launch(running.assignment, { part: "engine", rayAddress: running.rayAddress! }, running);
  }

  private supervisor(id: string, parts: Pick<SupervisorOptions, "prepare"> & Partial<Pick<SupervisorOptions, "preflight">>): EngineSupervisor {
    return new EngineSupervisor({
      replicaId: id,
      stateRoot: this.options.stateRoot,
      host: this.options.address,
      logger: this.options.logger,
      backoff: AGENT_BACKOFF,
      ...this.options.supervisor,
      ...parts,
    });
  }

  private async retire(replica: Running): Promise<void> {
    if (replica.stopping) return;
    replica.stopping = true;
    this.options.logger.info({ model: replica.assignment.modelName, replica: replica.assignment.replicaId }, "stopping replica");
    // The engine before the Ray head it runs on.
    await replica.supervisor?.stop();
    await replica.rayHead?.stop();
    for (const unsubscribe of replica.unsubscribers) unsubscribe();
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
      if (this.addressRefusal !== null) this.options.logger.info({ address: this.options.address }, "the server accepts this node's address again");
      this.addressRefusal = null;
    } catch (error) {
      if (error instanceof LlmgwError && error.code === "node_address_mismatch") this.addressRefused(error);
      else this.options.logger.warn({ err: describeError(error) }, "heartbeat failed");
    }
    this.scheduleHeartbeat(this.heartbeatMs);
  }

  /**
   * The server refuses every heartbeat of this node: it joined with (or an admin set)
   * another address than this agent's --advertise. Only an operator can fix that (restart
   * the agent with the approved address, or `ctl node update`), so it is an error, said
   * when it starts and once a minute while it lasts; the agent keeps beating meanwhile, and
   * the first accepted heartbeat ends it. Its engines keep running, but the server routes
   * nothing to them and, after the node timeout, takes the node for lost.
   */
  private addressRefused(error: LlmgwError): void {
    const now = Date.now();
    const refusal = this.addressRefusal;
    if (refusal !== null && refusal.message === error.message && now - refusal.loggedAt < ADDRESS_REFUSAL_LOG_MS) return;
    this.addressRefusal = { message: error.message, loggedAt: now };
    this.options.logger.error(
      { address: this.options.address, code: error.code, reason: error.message },
      "the server refuses this node's heartbeats: it reports another address than the one the node joined with; retrying",
    );
  }

  private report(): HeartbeatReport {
    return {
      name: this.options.name,
      address: this.options.address,
      inventory: this.options.inventory,
      labels: this.options.labels,
      replicas: [...this.running.values()].map((replica) => reportOf(replica)),
      cached: this.options.weights.held?.() ?? [],
      agentRun: this.run,
    };
  }
}

function reportOf(replica: Running): ReplicaReport {
  // A head whose engine waits for its workers reports its Ray head, as starting until the engine runs.
  const rayHead = replica.rayHead?.snapshot();
  const snapshot: SupervisorSnapshot = replica.supervisor?.snapshot() ?? {
    ...rayHead!,
    endpoint: null,
    state: rayHead!.state === "ready" ? "starting" : rayHead!.state,
  };
  const state: ReportedState = replica.fetching && snapshot.state === "starting" ? "fetching" : snapshot.state;
  return {
    ...(rayHead === undefined ? {} : { rayAddress: rayHead.state === "ready" ? replica.rayAddress : null }),
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
