// What a notification says: the webhook's JSON body ({"type", "timestamp", "data"}, as
// Standard Webhooks suggests) and a Slack message (a readable line, the message, and a
// link to the console). Both are made from the event alone, at each attempt. Everything
// an event carries (messages quote node errors and model names) is escaped for Slack, so
// it cannot ping a channel (<!channel>) or hide a link (<https://…|text>).
import { EVENT_KINDS, isEventKind, type Severity } from "../events/event-kinds.ts";
import type { StoredEvent } from "../events/event-log.ts";

/** The event as a delivery keeps it (an events row, or the test message). */
export type NotifyEvent = Omit<StoredEvent, "id"> & { id: number | null };

export function webhookBody(event: NotifyEvent): string {
  return JSON.stringify({
    type: event.kind,
    timestamp: event.at,
    data: { ...event.data, event_id: event.id, severity: event.severity, subject: event.subject, message: event.message },
  });
}

const SEVERITY_MARK: Record<Severity, string> = { info: ":information_source:", warning: ":warning:", critical: ":rotating_light:" };

/** Slack's mrkdwn treats these three as markup; anything from an event is escaped. */
function slackEscape(text: string): string {
  return text.replaceAll("&", "&amp;").replaceAll("<", "&lt;").replaceAll(">", "&gt;");
}

/** A URL inside Slack's <url|label>: escaped, and a '|' in it encoded so it cannot end the URL early. */
function slackLinkTarget(url: string): string {
  return slackEscape(url.replaceAll("|", "%7C"));
}

/** The console page that shows the event's subject (the console serves these paths). */
export function consoleLink(consoleUrl: string, event: NotifyEvent): string {
  const base = consoleUrl.replace(/\/+$/, "");
  const [type] = event.subject.split(":", 1);
  const page = type === "model" ? "models" : type === "node" ? "nodes" : type === "key" ? "keys" : type === "job" ? "jobs" : "events";
  return `${base}/#/${page}`;
}

export function slackBody(event: NotifyEvent, consoleUrl: string): string {
  const title = isEventKind(event.kind) ? EVENT_KINDS[event.kind].title : event.kind;
  const mark = SEVERITY_MARK[event.severity] ?? SEVERITY_MARK.info;
  const headline = `${mark} *${slackEscape(title)}* (${slackEscape(event.severity)}) · ${slackEscape(event.subject)}`;
  const link = slackLinkTarget(consoleLink(consoleUrl, event));
  return JSON.stringify({
    // The notification's text (phones, screen readers), and what older clients show. Slack
    // reads it as mrkdwn too (a raw <!channel> in it pings everyone), so it is escaped alike.
    text: `${slackEscape(title)}: ${slackEscape(event.message)}`,
    blocks: [
      { type: "section", text: { type: "mrkdwn", text: `${headline}\n${slackEscape(event.message)}` } },
      { type: "context", elements: [{ type: "mrkdwn", text: `<${link}|Open the llmgw console> · ${slackEscape(event.at)} · llmgw` }] },
    ],
  });
}
