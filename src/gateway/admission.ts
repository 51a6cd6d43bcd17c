// Admission control: how many requests each replica has in flight, which replica a request
// gets, and the per-model FIFO queue for requests that find every replica busy.
//
// A replica never has more than its `slots` requests in flight (an engine's parallel
// sequences, an external server's max_inflight): more would only queue inside the engine,
// where nobody can bound the wait or see it. Requests beyond that wait here, first come
// first served, and go to whichever replica frees a slot first. The queue is bounded
// (`queue_size`; full means 429 model_overloaded at once) and each wait has a deadline
// (`queue_timeout`; 503 queue_timeout). A model without replicas (scaling.min 0) keeps its
// requests in this same queue while the fleet starts one on demand. A model routed by
// prefix picks among its replicas by the request's affinity (prefix-affinity.ts) instead of
// the least busy; a waiter keeps its affinity for the moment a slot frees.
import { ClientClosedError, TooManyRequestsError, UnavailableError } from "../core/errors.ts";
import type { CatalogModel } from "../catalog/catalog.ts";
import { isComingUp, isRoutable } from "../fleet/model-health.ts";
import type { Replica, ReplicaListener } from "../fleet/replica-table.ts";
import { PREFIX_ROUTING_DEFAULTS } from "../catalog/model-schema.ts";
import { chooseByAffinity, HashRing, type AffinityCandidate } from "./prefix-affinity.ts";

/** What admission reads of the replica table. */
export interface ReplicaSource {
  forModel(modelId: string): readonly Replica[];
  onChange(listener: ReplicaListener): () => void;
}

/** A slot held at one replica; release it exactly once, when the request is over there. */
export interface Lease {
  replica: Replica;
  release(): void;
}

export interface AcquireOptions {
  /** Replicas this request already tried (a retry goes elsewhere). */
  exclude: ReadonlySet<string>;
  /** The client's request: a client that leaves stops waiting. */
  signal: AbortSignal;
  /** The hash of the request's prompt start, for a model routed by prefix (prefix-affinity.ts). */
  affinity?: number | undefined;
}

interface Waiter {
  model: CatalogModel;
  exclude: ReadonlySet<string>;
  affinity: number | undefined;
  settle(lease: Lease | null, error?: Error): void;
}

/** Requests in flight and queued now, as the autoscaler and drains read them (cluster/gateway-loads.ts). */
export interface GatewayLoad {
  /** Model id → requests in flight at its replicas plus those waiting in its queue. */
  models: Map<string, number>;
  /** Replica id → requests in flight there. */
  replicas: Map<string, number>;
}

/** A replica that just failed at the transport level is tried last for this long. */
const COOLDOWN_MS = 5000;

export class Admission {
  private readonly inFlight = new Map<string, number>();
  /** Requests in flight per model, also at replicas that left the table meanwhile (they still run). */
  private readonly modelInFlight = new Map<string, number>();
  private readonly coolingUntil = new Map<string, number>();
  private readonly queues = new Map<string, Waiter[]>();
  /** Each prefix-routed model's rings over its ready replicas, one per priority; dropped when any of its replicas changes. */
  private readonly rings = new Map<string, Map<number, HashRing>>();
  private rotation = 0;
  private readonly unsubscribe: () => void;

  constructor(
    private readonly replicas: ReplicaSource,
    private readonly clock: () => number = Date.now,
    /** Whether the fleet is starting a replica of the model on demand (then waiting is worthwhile though none exists yet). */
    private readonly startingOnDemand: (modelId: string) => boolean = () => false,
  ) {
    this.unsubscribe = replicas.onChange((replica, removed) => {
      if (removed) {
        this.inFlight.delete(replica.id);
        this.coolingUntil.delete(replica.id);
      }
      this.rings.delete(replica.modelId);
      // A replica that became ready (or left) changes what the model's waiters can get.
      this.pump(replica.modelId);
    });
  }

  close(): void {
    this.unsubscribe();
  }

  /** Requests in flight at a replica now. */
  inFlightAt(replicaId: string): number {
    return this.inFlight.get(replicaId) ?? 0;
  }

  /** Requests waiting for a replica of a model now. */
  waiting(modelId: string): number {
    return this.queues.get(modelId)?.length ?? 0;
  }

  /** Every model's requests in flight and queued, and every replica's in flight, now (copies). */
  load(): GatewayLoad {
    const models = new Map(this.modelInFlight);
    for (const [modelId, queue] of this.queues) models.set(modelId, (models.get(modelId) ?? 0) + queue.length);
    return { models, replicas: new Map(this.inFlight) };
  }

  /** Marks a replica as just failed, so others are preferred for a few seconds. */
  coolDown(replicaId: string): void {
    this.coolingUntil.set(replicaId, this.clock() + COOLDOWN_MS);
  }

  /**
   * A slot at the least busy ready replica of `model` not in `exclude`; when all of them
   * are full, a place in the model's queue until one frees. Resolves null when no ready
   * replica (outside `exclude`) exists or can come up, so the caller can say why.
   * Rejects with 429 when the queue is full, 503 when the wait passes `queue_timeout`,
   * and 499 when the client leaves while waiting.
   */
  acquire(model: CatalogModel, options: AcquireOptions): Promise<Lease | null> {
    const now = this.pick(model, options.exclude, options.affinity);
    if (now !== undefined) return Promise.resolve(this.lease(now));
    if (!this.worthWaiting(model, options.exclude)) return Promise.resolve(null);
    // A client already gone would never hear the signal's abort event: it does not queue
    // (and is no overload either).
    if (options.signal.aborted) return Promise.reject(new ClientClosedError("The client left before its request could wait for a free replica."));
    const queue = this.queues.get(model.id) ?? [];
    const { queue_size: size, queue_timeout: timeoutSeconds } = model.definition;
    if (queue.length >= size) {
      return Promise.reject(
        new TooManyRequestsError(
          `Model '${model.name}' is overloaded: every replica is busy and ${size === 0 ? "it queues no requests" : `its queue of ${size} is full`}. Retry after a short pause, or ask an administrator to add replicas or raise queue_size.`,
          { code: "model_overloaded", retryAfterSeconds: 1 },
        ),
      );
    }
    return new Promise<Lease | null>((resolve, reject) => {
      let settled = false;
      const onAbort = () => waiter.settle(null, new ClientClosedError("The client left while its request waited for a free replica."));
      const timer = setTimeout(
        () =>
          waiter.settle(
            null,
            new UnavailableError(
              `Model '${model.name}' stayed busy: the request waited ${timeoutSeconds} s in its queue without a free replica. Retry later, or ask an administrator to add replicas.`,
              { code: "queue_timeout", retryAfterSeconds: 5 },
            ),
          ),
        timeoutSeconds * 1000,
      );
      const waiter: Waiter = {
        model,
        exclude: options.exclude,
        affinity: options.affinity,
        settle: (lease, error) => {
          if (settled) {
            // Never leak a slot to a request that already left or timed out.
            lease?.release();
            return;
          }
          settled = true;
          clearTimeout(timer);
          options.signal.removeEventListener("abort", onAbort);
          this.dequeue(model.id, waiter);
          if (error !== undefined) reject(error);
          else resolve(lease);
        },
      };
      options.signal.addEventListener("abort", onAbort, { once: true });
      queue.push(waiter);
      this.queues.set(model.id, queue);
    });
  }

  private lease(replica: Replica): Lease {
    this.inFlight.set(replica.id, (this.inFlight.get(replica.id) ?? 0) + 1);
    this.modelInFlight.set(replica.modelId, (this.modelInFlight.get(replica.modelId) ?? 0) + 1);
    let released = false;
    return {
      replica,
      release: () => {
        if (released) return;
        released = true;
        const left = (this.inFlight.get(replica.id) ?? 1) - 1;
        if (left > 0) this.inFlight.set(replica.id, left);
        else this.inFlight.delete(replica.id);
        const leftOfModel = (this.modelInFlight.get(replica.modelId) ?? 1) - 1;
        if (leftOfModel > 0) this.modelInFlight.set(replica.modelId, leftOfModel);
        else this.modelInFlight.delete(replica.modelId);
        this.pump(replica.modelId);
      },
    };
  }

  /**
   * The least loaded replica with a free slot (in-flight requests over weight) within the
   * highest-priority profile that has a ready replica: a lower profile serves only when no
   * replica of a higher one is ready (down, starting, or already tried by this request),
   * not when they are merely busy; then the request waits for them in the queue. Ties go
   * to a rotating start, so equal replicas share sequential traffic evenly; a replica that
   * just failed counts as fully loaded until its cooldown ends. A request with an affinity
   * to a prefix-routed model goes by its prefix within that same priority first.
   */
  private pick(model: CatalogModel, exclude: ReadonlySet<string>, affinity: number | undefined): Replica | undefined {
    const candidates = this.replicas.forModel(model.id);
    const count = candidates.length;
    if (count === 0) return undefined;
    let priority = -Infinity;
    for (const replica of candidates) {
      if (isRoutable(replica) && !exclude.has(replica.id)) priority = Math.max(priority, replica.priority ?? 0);
    }
    const now = this.clock();
    if (affinity !== undefined && model.definition.routing === "prefix") {
      const chosen = this.pickByAffinity(model, candidates, priority, exclude, affinity, now);
      if (chosen !== undefined) return chosen;
    }
    const start = this.rotation++ % count;
    let best: Replica | undefined;
    let bestLoad = Infinity;
    for (let i = 0; i < count; i += 1) {
      const replica = candidates[(start + i) % count]!;
      if (!isRoutable(replica) || exclude.has(replica.id) || (replica.priority ?? 0) !== priority) continue;
      const inFlight = this.inFlight.get(replica.id) ?? 0;
      if (inFlight >= replica.slots) continue;
      const cooling = (this.coolingUntil.get(replica.id) ?? 0) > now;
      const load = cooling ? Number.MAX_SAFE_INTEGER : inFlight / replica.weight;
      if (load < bestLoad) {
        best = replica;
        bestLoad = load;
      }
    }
    return best;
  }

  /**
   * The replica the request's prefix belongs to, within the load bound (prefix-affinity.ts),
   * among the ready replicas of `priority`; undefined when none of them qualifies (all full,
   * tried or cooling), and the least busy choice decides.
   */
  private pickByAffinity(
    model: CatalogModel,
    replicas: readonly Replica[],
    priority: number,
    exclude: ReadonlySet<string>,
    affinity: number,
    now: number,
  ): Replica | undefined {
    const members = replicas.filter((replica) => isRoutable(replica) && (replica.priority ?? 0) === priority);
    let rings = this.rings.get(model.id);
    if (rings === undefined) {
      rings = new Map();
      this.rings.set(model.id, rings);
    }
    let ring = rings.get(priority);
    if (ring === undefined) {
      ring = new HashRing(members);
      rings.set(priority, ring);
    }
    // The ring has every member, so an excluded one hands its keys to the next; the bound is
    // over those the request may use (a replica without its adapter carries none of its load).
    const byId = new Map<string, Replica>();
    const candidates = new Map<string, AffinityCandidate>();
    for (const replica of members) {
      if (exclude.has(replica.id)) continue;
      const inFlight = this.inFlight.get(replica.id) ?? 0;
      const eligible = inFlight < replica.slots && (this.coolingUntil.get(replica.id) ?? 0) <= now;
      byId.set(replica.id, replica);
      candidates.set(replica.id, { weight: replica.weight, inFlight, eligible });
    }
    const loadFactor = model.definition.prefix?.load_factor ?? PREFIX_ROUTING_DEFAULTS.load_factor;
    const chosen = chooseByAffinity(ring, affinity, candidates, loadFactor);
    return chosen === undefined ? undefined : byId.get(chosen);
  }

  /** Whether some replica outside `exclude` is ready (busy) or on its way up. */
  private worthWaiting(model: CatalogModel, exclude: ReadonlySet<string>): boolean {
    return this.replicas.forModel(model.id).some((r) => !exclude.has(r.id) && (isRoutable(r) || isComingUp(r))) || this.startingOnDemand(model.id);
  }

  /** Looks at a model's waiters again (the fleet gave up starting it: parked, unplaceable). */
  recheck(modelId: string): void {
    this.pump(modelId);
  }

  /** Hands freed slots to the model's waiters in arrival order; ends waits that became hopeless. */
  private pump(modelId: string): void {
    const queue = this.queues.get(modelId);
    if (queue === undefined) return;
    for (const waiter of [...queue]) {
      const replica = this.pick(waiter.model, waiter.exclude, waiter.affinity);
      if (replica !== undefined) waiter.settle(this.lease(replica));
      else if (!this.worthWaiting(waiter.model, waiter.exclude)) waiter.settle(null);
    }
  }

  private dequeue(modelId: string, waiter: Waiter): void {
    const queue = this.queues.get(modelId);
    if (queue === undefined) return;
    const index = queue.indexOf(waiter);
    if (index >= 0) queue.splice(index, 1);
    if (queue.length === 0) this.queues.delete(modelId);
  }
}
