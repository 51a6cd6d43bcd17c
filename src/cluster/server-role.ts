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

  constructor(
    private readonly options: {
      /** A new Fleet for a term; `takeover`: another server led until now. */
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

  async lead(_term: number, previousLeader: string | null): Promise<void> {
    this.options.follower?.stop();
    const fleet = this.options.makeFleet(previousLeader !== null && previousLeader !== this.options.name);
    this.preparing = fleet;
    try {
      await this.options.services.jobs.recover();
      await fleet.start();
      await fleet.settled();
    } finally {
      this.preparing = null;
    }
    this.current = fleet;
    if (this.serving) await this.runServices();
  }

  async standBy(why: string): Promise<void> {
    await this.stopServices();
    const fleet = this.current;
    this.current = null;
    await fleet?.stop().catch((error: unknown) => this.options.logger.warn({ err: describeError(error) }, "could not stop the fleet cleanly"));
    if (!this.closing) {
      this.options.logger.info({ why }, "standing by: following the leader");
      await this.options.follower?.start();
    }
  }

  /** The server takes traffic now: a leader starts its services (a standby has none). */
  async serve(): Promise<void> {
    this.serving = true;
    if (this.current !== null) await this.runServices();
  }

  /** The server is stopping: a stand-by that follows is not the next thing to do. */
  closingDown(): void {
    this.closing = true;
    this.options.follower?.stop();
  }

  /** Stops the leader's services (not its Fleet); running jobs stop where they are. */
  async stopServices(): Promise<void> {
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
}
