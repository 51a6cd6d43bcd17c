// The audit trail: who changed what and when, across domains (catalog, keys, later
// fleet and jobs). Writers call `recordAudit` inside the transaction of the change it
// describes, so an entry exists exactly when the change does. Details never hold secrets.
import type { Db, Tx } from "./store.ts";

export interface AuditEntry {
  at: string;
  actor: string;
  action: string;
  target: string;
  detail: Record<string, unknown>;
}

export async function recordAudit(trx: Tx | Db, entry: AuditEntry): Promise<void> {
  await trx.insertInto("audit_log").values({ at: entry.at, actor: entry.actor, action: entry.action, target: entry.target, detail: JSON.stringify(entry.detail) }).execute();
}

export async function readAudit(db: Db, options: { limit?: number; target?: string; actionPrefix?: string } = {}): Promise<AuditEntry[]> {
  let query = db.selectFrom("audit_log").selectAll().orderBy("id", "desc").limit(options.limit ?? 100);
  if (options.target !== undefined) query = query.where("target", "=", options.target);
  if (options.actionPrefix !== undefined) query = query.where("action", "like", `${options.actionPrefix}%`);
  const rows = await query.execute();
  return rows.map((row) => ({ at: row.at, actor: row.actor, action: row.action, target: row.target, detail: JSON.parse(row.detail) as Record<string, unknown> }));
}
