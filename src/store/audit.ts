// The audit trail: who changed what and when, across domains (catalog, keys, the mirror,
// the agent's unpark). Writers call `recordAudit` inside the transaction of the change it
// describes, so an entry exists exactly when the change does. Details never hold secrets.
// Actions are `domain.verb` (model.create, key.revoke, mirror.fetch), so a reader can ask
// for one action or a whole domain by its prefix.
import { sql } from "kysely";
import type { Db, Store, Tx } from "./store.ts";
import { nowIso } from "./store.ts";

export interface AuditEntry {
  at: string;
  actor: string;
  action: string;
  target: string;
  detail: Record<string, unknown>;
}

export interface AuditQuery {
  limit?: number;
  /** Exactly this target (a model name, a key prefix, model/version). */
  target?: string;
  /** One action (`key.revoke`), or every action of a domain when it ends in "." (`key.`). */
  action?: string;
}

export async function recordAudit(trx: Tx | Db, entry: AuditEntry): Promise<void> {
  await trx
    .insertInto("audit_log")
    .values({ at: entry.at, actor: entry.actor, action: entry.action, target: entry.target, detail: JSON.stringify(entry.detail) })
    .execute();
}

/** Newest first. */
export async function readAudit(db: Db, options: AuditQuery = {}): Promise<AuditEntry[]> {
  let query = db
    .selectFrom("audit_log")
    .selectAll()
    .orderBy("id", "desc")
    .limit(options.limit ?? 100);
  if (options.target !== undefined) query = query.where("target", "=", options.target);
  const action = options.action;
  if (action !== undefined) {
    // A prefix compares the first characters rather than using LIKE, where '_' and '%'
    // in the value would be wildcards.
    query = action.endsWith(".") ? query.where(sql<string>`substr(action, 1, ${sql.lit(action.length)})`, "=", action) : query.where("action", "=", action);
  }
  const rows = await query.execute();
  return rows.map((row) => ({
    at: row.at,
    actor: row.actor,
    action: row.action,
    target: row.target,
    detail: JSON.parse(row.detail) as Record<string, unknown>,
  }));
}

/** The trail as the admin API uses it: read with filters, and record actions that change no table (unpark). */
export interface AuditTrail {
  read(query: AuditQuery): Promise<AuditEntry[]>;
  record(entry: Omit<AuditEntry, "at">): Promise<void>;
}

export function auditTrail(store: Store, clock: () => number = Date.now): AuditTrail {
  return {
    read: (query) => readAudit(store.db, query),
    record: (entry) => recordAudit(store.db, { ...entry, at: nowIso(clock) }),
  };
}
