// The autoscaler at work on the leader: each fleet tick it reads the gateway load of all
// servers (cluster/gateway-loads.ts), runs the rule (autoscaler.ts) for every model that
// may scale, and hands the replicas each one wants to the reconciler, which places new ones
// like any other (no room: the unplaceable explanation) and drains the ones it stops.
//
// A model scales when it runs on engines and scaling.max is above its floor (min, or 1 for
// an on-demand model while it is wanted). What was decided is kept in `model_scaling`, so a
// restarted server or a new leader goes on from the replicas wanted then instead of
// dropping to scaling.min and stopping replicas that carry load; standbys read it too.
// Each decision is an event (`model_scaled`) and the model's last decision is shown with
// its target and the current load (ctl model show, the console).
import { describeError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import type { CatalogModel } from "../catalog/catalog.ts";
import { SCALING_DEFAULTS } from "../catalog/model-schema.ts";
import type { EventLog } from "../events/event-log.ts";
import type { Fence } from "../cluster/leadership.ts";
import { nowIso, type Store, type Tx } from "../store/store.ts";
import { decideScaling, initialScalingState, type ScalingDecision, type ScalingPolicy, type ScalingState } from "./autoscaler.ts";
import { profileSlots } from "./record-projections.ts";
import { runsOnEngines } from "./reconciler.ts";

/** The load of all servers, as the autoscaler reads it (GatewayLoads; on SQLite this server's alone). */
export interface ScalingLoad {
  refresh(): Promise<boolean>;
  readonly known: boolean;
  model(modelId: string): number;
}

/** A model's autoscaling as the admin API shows it (the health view, ctl, the console). */
export interface AutoscalingView {
  min: number;
  max: number;
  target: number;
  up_after: number;
  down_after: number;
  /** Requests in flight and queued, all servers together, at the last tick (null: not read). */
  load: number | null;
  /** Replicas the fleet wants for the model now (reconciler.ts wantedReplicas): what autoscaling decided, 0 while an on-demand model sleeps. */
  desired: number;
  last: (Omit<ScalingDecision, "at"> & { at: string }) | null;
}

/** How the model scales, or null when it does not (no engines, or max at its floor). */
export function scalingPolicyOf(model: CatalogModel): ScalingPolicy | null {
  const { scaling } = model.definition;
  if (!runsOnEngines(model) || scaling.max <= Math.max(scaling.min, 1)) return null;
  const first = model.definition.profiles.find((profile) => profile.engine !== "external");
  return {
    min: scaling.min,
    max: scaling.max,
    target: scaling.target ?? (first === undefined ? 1 : profileSlots(first)),
    upAfterMs: (scaling.up_after ?? SCALING_DEFAULTS.up_after) * 1000,
    downAfterMs: (scaling.down_after ?? SCALING_DEFAULTS.down_after) * 1000,
  };
}

export class Autoscaling {
  private readonly states = new Map<string, ScalingState>();
  private readonly loads = new Map<string, number>();
  /** The tick under way: a second call while it runs waits for it rather than start another. */
  private running: Promise<void> | null = null;
  /** The store writes, one after another: a model's delete can never land after its next decision. */
  private writes: Promise<void> = Promise.resolve();
  private readonly gatewayLoad: ScalingLoad;

  constructor(
    private readonly options: {
      store: Store;
      events: EventLog;
      logger: Logger;
      clock: () => number;
      /** Absent: no gateway, no load (nothing scales up). */
      load?: ScalingLoad | undefined;
      /** Whether an on-demand model (scaling.min 0) wants replicas now: asleep, it is not scaled. */
      awake: (modelId: string) => boolean;
      /** Whether the model is parked: its load says nothing then (requests get 503 at once), so nothing is decided. */
      parked: (modelId: string) => boolean;
      /** Several servers: the writes commit only while this server leads (cluster/leadership.ts). */
      fence?: Fence | undefined;
      /** Desired replicas changed: reconcile. */
      onChange: () => void;
    },
  ) {
    this.gatewayLoad = options.load ?? { refresh: async () => true, known: true, model: () => 0 };
  }

  /** Reads what the last leader decided. */
  async load(): Promise<void> {
    for (const row of await this.options.store.db.selectFrom("model_scaling").selectAll().execute()) {
      const last = parseDecision(row.last_decision);
      this.states.set(row.model_id, { desired: row.desired, overSince: null, underSince: null, last });
    }
    // A new leader's first drains count the other servers' requests too.
    await this.gatewayLoad.refresh();
  }

  /** Resolves once the tick under way and the writes asked for are done (the fleet's stop waits for them). */
  async idle(): Promise<void> {
    await this.running;
    await this.writes;
  }

  /**
   * One look at every model (the fleet's 1 s tick). Nothing is decided while the other
   * servers' load cannot be read: scaling down on half the picture would stop replicas
   * that carry the rest.
   */
  tick(models: readonly CatalogModel[]): Promise<void> {
    this.running ??= this.decide(models).finally(() => {
      this.running = null;
    });
    return this.running;
  }

  private async decide(models: readonly CatalogModel[]): Promise<void> {
    try {
      if (!(await this.gatewayLoad.refresh()) || !this.gatewayLoad.known) return;
      const now = this.options.clock();
      let changed = false;
      const seen = new Set<string>();
      for (const model of models) {
        const policy = scalingPolicyOf(model);
        if (policy === null || (policy.min === 0 && !this.options.awake(model.id))) continue;
        seen.add(model.id);
        // Parked: kept as it was, to go on from once unparked.
        if (this.options.parked(model.id)) continue;
        const load = this.gatewayLoad.model(model.id);
        this.loads.set(model.id, load);
        const kept = this.states.get(model.id);
        const before = kept ?? initialScalingState(policy);
        const after = decideScaling(policy, before, load, now);
        this.states.set(model.id, after);
        if (kept?.desired !== after.desired) changed = true;
        if (after.last !== before.last && after.last !== null) this.announce(model, after);
      }
      // Models that stopped scaling (deleted, max lowered to min, asleep) go back to their plain count.
      for (const modelId of [...this.states.keys()]) {
        if (seen.has(modelId)) continue;
        this.forget(modelId);
        changed = true;
      }
      if (changed) this.options.onChange();
    } catch (error) {
      this.options.logger.warn({ err: describeError(error) }, "autoscaling tick failed");
    }
  }

  /** The replicas autoscaling wants for the model now, or undefined when it does not scale it (the reconciler's `autoscaled`). */
  desiredOf(modelId: string): number | undefined {
    return this.states.get(modelId)?.desired;
  }

  /** Every scaled model's replicas wanted now, for one reconciliation. */
  desired(): Map<string, number> {
    return new Map([...this.states].map(([modelId, state]) => [modelId, state.desired]));
  }

  /** The model's autoscaling for the admin API, with `desired` the replicas the fleet wants now (reconciler.ts wantedReplicas). */
  view(model: CatalogModel, desired: number): AutoscalingView | null {
    const policy = scalingPolicyOf(model);
    if (policy === null) return null;
    const last = this.states.get(model.id)?.last ?? null;
    return {
      min: policy.min,
      max: policy.max,
      target: policy.target,
      up_after: policy.upAfterMs / 1000,
      down_after: policy.downAfterMs / 1000,
      // Counts that could not be read lately are no "load now".
      load: this.gatewayLoad.known ? (this.loads.get(model.id) ?? null) : null,
      desired,
      last: last === null ? null : { ...last, at: new Date(last.at).toISOString() },
    };
  }

  private forget(modelId: string): void {
    this.states.delete(modelId);
    this.loads.delete(modelId);
    this.write(modelId, (db) => db.deleteFrom("model_scaling").where("model_id", "=", modelId).execute());
  }

  /** Records the decision (kept for a restart or the next leader, read by standbys), then tells operators. */
  private announce(model: CatalogModel, state: ScalingState): void {
    const decision = state.last!;
    const { direction, from, to, why } = decision;
    this.options.logger.info({ model: model.name, direction, from, to, why }, "autoscaling");
    const values = { desired: state.desired, last_decision: JSON.stringify(decision), updated_at: nowIso(this.options.clock) };
    const replicas = (n: number) => `${n} replica${n === 1 ? "" : "s"}`;
    const going = from - to;
    const message =
      direction === "up"
        ? `Model '${model.name}' scales up from ${replicas(from)} to ${to}: ${why}.`
        : `Model '${model.name}' scales down from ${replicas(from)} to ${to}: ${why}; ${going === 1 ? "the replica that goes is" : `the ${going} replicas that go are`} drained first.`;
    this.write(
      model.id,
      (db) =>
        db
          .insertInto("model_scaling")
          .values({ model_id: model.id, ...values })
          .onConflict((oc) => oc.column("model_id").doUpdateSet(values))
          .execute(),
      // Only once written through the fence: a server that just lost the lead announces nothing.
      () =>
        void this.options.events.record({
          kind: "model_scaled",
          subject: `model:${model.name}`,
          data: { model: model.name, direction, from, to, why },
          message,
        }),
    );
  }

  private write(modelId: string, body: (db: Store["db"] | Tx) => Promise<unknown>, then?: () => void): void {
    const fence = this.options.fence;
    this.writes = this.writes
      .then(async () => {
        if (fence === undefined) await body(this.options.store.db);
        else await fence.write((trx) => body(trx));
        then?.();
      })
      .catch((error: unknown) =>
        // The decision holds for this run; a restart would start again from scaling.min.
        this.options.logger.warn({ model: modelId, err: describeError(error) }, "could not record the model's autoscaling"),
      );
  }
}

/** A recorded decision (`model_scaling.last_decision`) as the admin API shows it, or null. */
export function scalingDecisionView(text: string | null): AutoscalingView["last"] {
  const decision = parseDecision(text);
  return decision === null ? null : { ...decision, at: new Date(decision.at).toISOString() };
}

function parseDecision(text: string | null): ScalingDecision | null {
  if (text === null) return null;
  try {
    const parsed = JSON.parse(text) as ScalingDecision;
    return typeof parsed.from === "number" && typeof parsed.to === "number" && typeof parsed.at === "number" ? parsed : null;
  } catch {
    return null;
  }
}
