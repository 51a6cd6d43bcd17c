// What a server does as leader and as standby, and the switch between the two
// (leadership.ts calls `lead` and `standBy`). The leader runs a Fleet of its own (made
// fresh for each term: the reconciler's memory belongs to one term), the jobs, update
// checks, budget alerts, the notifier and usage retention. A standby runs none of them; it
// follows the leader's rows (fleet-follower.ts) so its gateway routes all the same.
//
// Taking the lead: the follower stops (its routing table stays, and the new Fleet takes it
// over), jobs the last leader left unfinished take back their holds, the Fleet reads the
// rows and reconciles once; then, once the server serves (`serve`), jobs resume and the
// services start. Giving it up stops them in the reverse order; running jobs stop where
// they are, to be resumed by the next leader.
import { describeError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import type { Fleet } from "../fleet/fleet.ts";
import type { JobRunner } from "../serve/jobs.ts";
import type { UpdateChecker } from "../serve/update-checker.ts";
import type { Notifier } from "../notify/notifier.ts";
import type { BudgetAlerts } from "../policy/budget-alerts.ts";
import type { UsageRetention } from "../usage/usage-retention.ts";
import type { LeadershipListener } from "./leadership.ts";
import type { FleetFollower } from "./fleet-follower.ts";

export interface LeaderServices {
  jobs: JobRunner;
  updates: UpdateChecker;
  budgetAlerts: BudgetAlerts;
  notifier: Notifier;
  usageRetention: UsageRetention;
}

export class ServerRole implements LeadershipListener {
  private current: Fleet | null = null;
  private preparing: Fleet | null = null;
  private serving = false;
  private running = false;
  private closing = false;
  /** Whether this process has led before: leading again, its last Fleet's states are still true. */
  private ledBefore = false;
  /** Lead, stand-by, serve and stopping the services run one at a time, in order. */
  private chain: Promise<void> = Promise.resolve();

  constructor(
    private readonly options: {
      /** A new Fleet for a term; `takeover`: the replicas' states in the rows were kept up to now by a running leader. */
      makeFleet: (takeover: boolean) => Fleet;
      services: LeaderServices;
      /** Null where there is nothing to follow (SQLite: one server). */
      follower: FleetFollower | null;
      /** This server's name (a lead taken over from itself is not a takeover). */
      name: string;
      logger: Logger;
    },
  ) {}

  /** This server's Fleet while it leads (started: it answers the agents and the fleet's routes). */
  get fleet(): Fleet | null {
    return this.current;
  }

  /** The Fleet the jobs use: the leader's, or the one being started (an update's recovery takes its hold through it). */
  get jobsFleet(): Fleet | null {
    return this.current ?? this.preparing;
  }

  /** Between winning the lead and having the Fleet started: the leader's requests wait a moment (503, retried). */
  get takingLead(): boolean {
    return this.preparing !== null;
  }

  lead(_term: number, previousLeader: string | null): Promise<void> {
    return this.queue(async () => {
      // Stopping: the lead is given up in a moment; nothing is started for it.
      if (this.closing) return;
      await this.options.follower?.stop();
      // Another server led until now, or this process did: the rows hold the states a
      // running leader kept. A server that starts again after leading itself (its own
      // earlier run) waits for the nodes' reports instead.
      const takeover = previousLeader !== null && (previousLeader !== this.options.name || this.ledBefore);
      const fleet = this.options.makeFleet(takeover);
      this.ledBefore = true;
      this.preparing = fleet;
      try {
        await this.options.services.jobs.recover();
        await fleet.start();
        await fleet.settled();
      } catch (error) {
        await fleet.stop().catch(() => undefined);
        throw error;
      } finally {
        this.preparing = null;
      }
      this.current = fleet;
      if (this.serving) await this.runServices();
    });
  }

  standBy(why: string): Promise<void> {
    return this.queue(async () => {
      await this.stopRunningServices();
      const fleet = this.current;
      this.current = null;
      await fleet?.stop().catch((error: unknown) => this.options.logger.warn({ err: describeError(error) }, "could not stop the fleet cleanly"));
      if (!this.closing) {
        this.options.logger.info({ why }, "standing by: following the leader");
        await this.options.follower?.start();
      }
    });
  }

  /** The server takes traffic now: a leader starts its services (a standby has none). */
  serve(): Promise<void> {
    return this.queue(async () => {
      this.serving = true;
      if (this.current !== null && !this.closing) await this.runServices();
    });
  }

  /** The server is stopping: no lead is taken up from now on, and the follower stops. */
  async closingDown(): Promise<void> {
    this.closing = true;
    await this.options.follower?.stop();
  }

  /** Stops the leader's services (not its Fleet); running jobs stop where they are. */
  stopServices(): Promise<void> {
    return this.queue(() => this.stopRunningServices());
  }

  private async stopRunningServices(): Promise<void> {
    if (!this.running) return;
    this.running = false;
    const { services } = this.options;
    services.updates.stop();
    await services.budgetAlerts.stop();
    await services.notifier.stop();
    await services.jobs.close();
    await services.usageRetention.stop();
  }

  private async runServices(): Promise<void> {
    if (this.running) return;
    this.running = true;
    const { services } = this.options;
    // Jobs cut by the last stop (or the last leader) continue.
    await services.jobs.start();
    services.updates.start();
    await services.budgetAlerts.start();
    await services.notifier.start();
    services.usageRetention.start();
  }

  private queue(step: () => Promise<void>): Promise<void> {
    const run = this.chain.then(step);
    this.chain = run.catch(() => undefined);
    return run;
  }
}
