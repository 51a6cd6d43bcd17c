// The Events page: what llmgw told operators about (parked models, lost nodes, budgets,
// new weights, failed jobs), newest first. It starts from the latest recorded events
// (GET /api/v1/events) and adds each new one as the shared event stream delivers it, so an
// event shows without a reload; the list is also re-read every 2 s, which fills any gap a
// dropped stream left. A select narrows it to one kind.
import { html, useEffect, useMemo, useState } from "../vendor/preact-htm.js";
import { onEvent, recentEvents, usePoll } from "../lib/live.js";
import { ErrorNote, Loading, relativeTime } from "../lib/ui.js";

/** The recorded kinds of src/events/event-kinds.ts, with their titles (the console cannot import server code). */
const EVENT_KINDS = {
  model_parked: "Model parked",
  model_unparked: "Model unparked",
  replica_unplaceable: "Replica cannot be placed",
  node_lost: "Node lost",
  node_back: "Node back",
  node_address_refused: "Node report on another address refused",
  node_address_changed: "Node address changed",
  replica_moved: "Replica moved to spread a model",
  model_scaled: "Model scaled",
  budget_exhausted: "Budget spent",
  budget_exceeded: "Budget exceeded",
  budget_threshold: "Budget nearly spent",
  new_weights: "New weights published",
  job_failed: "Job failed",
  update_done: "Model updated",
};

/** How many events the page keeps: the latest recorded ones plus those that arrive while it is open. */
const SHOWN = 200;

const SEVERITY_TONE = { critical: "bad", warning: "busy", info: "neutral" };

function titleOf(kind) {
  return EVENT_KINDS[kind] ?? kind;
}

function SeverityBadge({ severity }) {
  return html`<span class=${`badge badge-${SEVERITY_TONE[severity] ?? "neutral"}`}>${severity}</span>`;
}

/** A data value as text: strings as they are, anything else as JSON (htm escapes it either way). */
function dataText(value) {
  return typeof value === "string" ? value : JSON.stringify(value);
}

/** What the event is about; a job links to its page, where its steps say what went wrong. */
function Subject({ subject }) {
  const job = /^job:(.+)$/.exec(subject);
  const text = html`<code class="event-subject">${subject}</code>`;
  return job === null ? text : html`<a href=${`#/jobs/${encodeURIComponent(job[1])}`}>${text}</a>`;
}

function EventItem({ event }) {
  const fields = Object.entries(event.data ?? {});
  return html`<li class="panel event" data-event-id=${event.id} data-kind=${event.kind}>
    <div class="event-head">
      <span class="event-title">${titleOf(event.kind)}</span>
      <${SeverityBadge} severity=${event.severity} />
      <${Subject} subject=${event.subject} />
      <time class="muted" datetime=${event.at} title=${event.at}>${new Date(event.at).toLocaleString()} (${relativeTime(event.at)})</time>
    </div>
    <p class="event-message">${event.message}</p>
    ${
      fields.length === 0
        ? null
        : html`<details>
          <summary>Data</summary>
          <dl class="facts">
            ${fields.map(([name, value]) => html`<dt>${name}</dt><dd>${dataText(value)}</dd>`)}
          </dl>
        </details>`
    }
  </li>`;
}

export function EventsPage() {
  const [kind, setKind] = useState("");
  // Events the stream delivered while the page is open, by id; they show at once, before the next poll.
  const [arrived, setArrived] = useState(() => new Map());
  const recent = usePoll((signal) => recentEvents({ kinds: kind || undefined, limit: 100, signal }), [kind], { reloadOnEvents: false });

  useEffect(
    () =>
      onEvent((event) => {
        if (typeof event?.id !== "number") return;
        setArrived((previous) => {
          const next = new Map(previous);
          next.set(event.id, event);
          // Keep only the newest: a long-open page must not grow without bound.
          if (next.size > SHOWN) next.delete(Math.min(...next.keys()));
          return next;
        });
      }),
    [],
  );

  const shown = useMemo(() => {
    const byId = new Map();
    // Both filtered here too: what the last poll read may still be of the kind chosen before.
    for (const event of [...(recent.data ?? []), ...arrived.values()]) if (kind === "" || event.kind === kind) byId.set(event.id, event);
    return [...byId.values()].sort((a, b) => b.id - a.id).slice(0, SHOWN);
  }, [recent.data, arrived, kind]);

  return html`<h1>Events</h1>
    <p class="muted">What llmgw tells operators about, newest first. New events appear here as they happen.</p>
    <div class="toolbar">
      <div class="field">
        <label for="event-kind">Kind</label>
        <select id="event-kind" value=${kind} onChange=${(event) => setKind(event.currentTarget.value)}>
          <option value="">All kinds</option>
          ${Object.entries(EVENT_KINDS).map(([name, title]) => html`<option value=${name}>${title}</option>`)}
        </select>
      </div>
      <p class="muted event-count" role="status">${recent.data === null ? "" : `${shown.length} ${shown.length === 1 ? "event" : "events"} shown`}</p>
    </div>
    <${ErrorNote} error=${recent.error} />
    ${
      recent.data === null && recent.loading
        ? html`<${Loading} what="events" />`
        : shown.length === 0
          ? html`<p class="muted">${kind === "" ? "No events yet." : `No '${titleOf(kind)}' events yet.`} New ones will appear here.</p>`
          : html`<ol class="event-list" aria-label="Events, newest first">
            ${shown.map((event) => html`<${EventItem} key=${event.id} event=${event} />`)}
          </ol>`
    }`;
}
