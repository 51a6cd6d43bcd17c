// Events: what happened that an operator should hear about (node_lost, node_back,
// model_parked, model_unparked, ...), kept in the store's `events` table with kind,
// severity, subject and message. The notifications issue reads them, sends them on and
// adds the rest of the kinds; here they are recorded and listed.
import type { Db } from "../store/store.ts";

export interface FleetEvent {
  at: string;
  kind: string;
  severity: "info" | "warning" | "critical";
  /** "node:NAME" or "model:NAME". */
  subject: string;
  message: string;
}

export async function recordEvent(db: Db, event: FleetEvent): Promise<void> {
  await db.insertInto("events").values(event).execute();
}

/** Newest first. */
export async function readEvents(db: Db, query: { kind?: string; limit?: number } = {}): Promise<FleetEvent[]> {
  let select = db.selectFrom("events").select(["at", "kind", "severity", "subject", "message"]).orderBy("id", "desc").limit(query.limit ?? 100);
  if (query.kind !== undefined) select = select.where("kind", "=", query.kind);
  return (await select.execute()) as FleetEvent[];
}
