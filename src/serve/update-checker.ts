// The update check: for each model served from a registry repository, whether the branch
// (or tag) it follows now points at a newer commit than the one it serves. Runs on a
// schedule (default every 6 h) and on demand (`ctl model check-updates`); what it found is
// kept in `model_updates` (GET /api/v1/updates), and a newly published revision is
// recorded once as a `new_weights` event.
import { describeError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import type { Catalog, CatalogModel } from "../catalog/catalog.ts";
import type { EventLog } from "../events/event-log.ts";
import { isLocalSource } from "../registry/local-source.ts";
import type { Registry } from "../registry/types.ts";
import { nowIso, type Store } from "../store/store.ts";

export const DEFAULT_UPDATE_CHECK_INTERVAL_MS = 6 * 3600_000;
/** The first scheduled check waits this long after start, so a starting server reads the registry once it has settled. */
const FIRST_CHECK_DELAY_MS = 60_000;

export interface UpdateView {
  model: string;
  repo: string;
  revision: string;
  /** The branch or tag followed. */
  ref: string;
  latest_revision: string | null;
  update_available: boolean;
  checked_at: string | null;
  error: string | null;
}

export interface UpdateCheckerOptions {
  store: Store;
  catalog: Catalog;
  registry: Registry;
  logger: Logger;
  /** Where new_weights is recorded. */
  events: EventLog;
  intervalMs?: number;
  clock?: () => number;
}

export class UpdateChecker {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<UpdateView[]> | undefined;
  private stopping = new AbortController();
  private readonly clock: () => number;

  constructor(private readonly options: UpdateCheckerOptions) {
    this.clock = options.clock ?? Date.now;
  }

  /** Starts the schedule (0 turns it off). */
  start(): void {
    // Started again when a server leads again after standing by.
    this.stopping = new AbortController();
    const interval = this.options.intervalMs ?? DEFAULT_UPDATE_CHECK_INTERVAL_MS;
    if (interval <= 0) return;
    const tick = () => {
      void this.checkNow().catch((error: unknown) => this.options.logger.warn({ err: describeError(error) }, "update check failed"));
      this.timer = setTimeout(tick, interval);
      this.timer.unref();
    };
    this.timer = setTimeout(tick, Math.min(FIRST_CHECK_DELAY_MS, interval));
    this.timer.unref();
  }

  stop(): void {
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.stopping.abort();
  }

  /** Checks every model with a registry origin (or the one named) now; one check at a time. */
  async checkNow(name?: string): Promise<UpdateView[]> {
    if (name !== undefined) this.options.catalog.get(name);
    while (this.running !== undefined) await this.running.catch(() => undefined);
    this.running = this.checkAll(name).finally(() => (this.running = undefined));
    return this.running;
  }

  /** What the last checks found, for every model that has a registry origin. */
  async list(name?: string): Promise<UpdateView[]> {
    const rows = await this.options.store.db.selectFrom("model_updates").selectAll().execute();
    const byModel = new Map(rows.map((row) => [row.model_id, row]));
    return this.followed(name).map((model) => {
      const origin = model.definition.origin!;
      const row = byModel.get(model.id);
      // A row about another revision than the one served now (an update ran since) says nothing of now.
      const current = row !== undefined && row.revision === origin.revision;
      const latest = current ? row.latest_revision : null;
      return {
        model: model.name,
        repo: origin.repo,
        revision: origin.revision,
        ref: origin.ref ?? "main",
        latest_revision: latest,
        update_available: latest !== null && latest !== origin.revision,
        checked_at: current ? row.checked_at : null,
        error: current ? row.error : null,
      };
    });
  }

  private followed(name?: string): CatalogModel[] {
    return this.options.catalog
      .list()
      .filter((model) => model.definition.origin !== undefined && !isLocalSource(model.definition.origin.repo) && (name === undefined || model.name === name));
  }

  private async checkAll(name?: string): Promise<UpdateView[]> {
    for (const model of this.followed(name)) {
      if (this.stopping.signal.aborted) break;
      await this.checkOne(model);
    }
    return this.list(name);
  }

  private async checkOne(model: CatalogModel): Promise<void> {
    const origin = model.definition.origin!;
    const ref = origin.ref ?? "main";
    const db = this.options.store.db;
    const previous = await db.selectFrom("model_updates").selectAll().where("model_id", "=", model.id).executeTakeFirst();
    let latest: string | null = null;
    let error: string | null = null;
    try {
      latest = (
        await this.options.registry.repoInfo({ repo: origin.repo, revision: ref, signal: AbortSignal.any([this.stopping.signal, AbortSignal.timeout(60_000)]) })
      ).sha;
    } catch (failure) {
      error = describeError(failure);
      this.options.logger.warn({ model: model.name, repo: origin.repo, err: error }, "update check could not read the repository");
    }
    // A failed read keeps what the last good one found, so the next success is news only if the repository moved.
    const known = previous?.revision === origin.revision ? previous.latest_revision : null;
    const row = { repo: origin.repo, revision: origin.revision, latest_revision: latest ?? known, checked_at: nowIso(this.clock), error };
    if (previous === undefined)
      await db
        .insertInto("model_updates")
        .values({ model_id: model.id, ...row })
        .execute();
    else await db.updateTable("model_updates").set(row).where("model_id", "=", model.id).execute();
    const news = latest !== null && latest !== origin.revision && latest !== previous?.latest_revision;
    if (news) {
      this.options.logger.info({ model: model.name, repo: origin.repo, revision: origin.revision, latest }, "new weights published");
      await this.options.events.record({
        kind: "new_weights",
        subject: `model:${model.name}`,
        data: { model: model.name, repo: origin.repo, ref, old_revision: origin.revision, new_revision: latest },
        message: `${origin.repo} published ${latest!.slice(0, 12)} on '${ref}'; '${model.name}' serves ${origin.revision.slice(0, 12)}. Move to it with 'llmgw ctl model update ${model.name}'.`,
      });
    }
  }
}
