// The kinds of events llmgw tells operators about, with their severity and a short title
// (Slack messages, the console). Channels filter by these names, so an unknown name is
// refused where it is given (`--events`, `?kind=`), not silently matched by nothing.
import { BadRequestError } from "../core/errors.ts";

export const SEVERITIES = ["info", "warning", "critical"] as const;
export type Severity = (typeof SEVERITIES)[number];

export function severityRank(severity: Severity): number {
  return SEVERITIES.indexOf(severity);
}

/** Every kind, with the severity it is recorded at and a title a person reads first. */
export const EVENT_KINDS = {
  model_parked: { severity: "critical", title: "Model parked" },
  model_unparked: { severity: "info", title: "Model unparked" },
  replica_unplaceable: { severity: "warning", title: "Replica cannot be placed" },
  node_lost: { severity: "warning", title: "Node lost" },
  node_back: { severity: "info", title: "Node back" },
  node_address_refused: { severity: "warning", title: "Node report on another address refused" },
  node_address_changed: { severity: "info", title: "Node address changed" },
  replica_moved: { severity: "info", title: "Replica moved to spread a model" },
  model_scaled: { severity: "info", title: "Model scaled" },
  budget_exhausted: { severity: "critical", title: "Budget spent" },
  budget_exceeded: { severity: "critical", title: "Budget exceeded" },
  budget_threshold: { severity: "warning", title: "Budget nearly spent" },
  new_weights: { severity: "info", title: "New weights published" },
  job_failed: { severity: "warning", title: "Job failed" },
  update_done: { severity: "info", title: "Model updated" },
  // Sent by `llmgw ctl notify test` only; never recorded in the events table.
  notify_test: { severity: "info", title: "Test notification" },
} as const satisfies Record<string, { severity: Severity; title: string }>;

export type EventKind = keyof typeof EVENT_KINDS;

/** The kinds that are recorded (everything but the test message). */
export const RECORDED_KINDS = Object.keys(EVENT_KINDS).filter((kind) => kind !== "notify_test") as Exclude<EventKind, "notify_test">[];

export function isEventKind(kind: string): kind is EventKind {
  return Object.hasOwn(EVENT_KINDS, kind);
}

/** Parses "k1,k2" (or a list) into known kinds; throws naming the unknown one and the choices. */
export function parseEventKinds(value: string | readonly string[], param: string): EventKind[] {
  const names = (typeof value === "string" ? value.split(",") : [...value]).map((name) => name.trim()).filter((name) => name !== "");
  if (names.length === 0)
    throw new BadRequestError(`${param} names no event kind; give one or more of: ${RECORDED_KINDS.join(", ")}.`, { code: "invalid_event_kind", param });
  for (const name of names) {
    if (!isEventKind(name) || name === "notify_test") {
      throw new BadRequestError(`${param}: '${name}' is not an event kind; choose from ${RECORDED_KINDS.join(", ")}.`, { code: "invalid_event_kind", param });
    }
  }
  return [...new Set(names)] as EventKind[];
}
