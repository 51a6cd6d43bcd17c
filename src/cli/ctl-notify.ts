// `llmgw ctl notify ...` and `llmgw ctl events`: notification channels over the admin API
// (add a signed webhook or a Slack incoming webhook, list, change, enable after a 410,
// remove, send a test, read a channel's delivery log), and the event log they are fed
// from (list, or follow live). A webhook's generated secret is printed once, at `add`.
import type { Command } from "commander";
import { BadRequestError, describeError, LlmgwError } from "../core/errors.ts";
import type { AdminClient } from "./admin-client.ts";
import { type CtlHelpers, type CtlOptions as Options, wantsJson, withExamples } from "./ctl-common.ts";
import { renderTable } from "./output.ts";

interface ChannelView {
  name: string;
  kind: string;
  url: string;
  events: string[] | null;
  min_severity: string;
  enabled: boolean;
  disabled_reason: string | null;
  deliveries?: Record<string, number>;
  secret?: string;
}

interface DeliveryView {
  id: number;
  kind: string;
  subject: string;
  state: string;
  attempts: number;
  last_status: number | null;
  last_error: string | null;
  next_attempt_at: string | null;
  created_at: string;
}

interface EventView {
  id: number;
  at: string;
  kind: string;
  severity: string;
  subject: string;
  message: string;
}

const path = (name: string, rest = "") => `/api/v1/notify/${encodeURIComponent(name)}${rest}`;

/** The filter flags as API fields; 'all' clears the kinds on update and is the default on add. */
function filterFields(options: Options, adding = false): Record<string, unknown> {
  const all = options.events === "all";
  return {
    ...(typeof options.events === "string" && !(all && adding) ? { events: all ? null : options.events } : {}),
    ...(typeof options.minSeverity === "string" ? { min_severity: options.minSeverity } : {}),
  };
}

function describeChannel(channel: ChannelView): string {
  const state = channel.enabled ? "enabled" : `DISABLED (${channel.disabled_reason ?? "by an operator"})`;
  return `${channel.kind} ${channel.url}; events: ${channel.events?.join(",") ?? "all"}, from ${channel.min_severity}; ${state}`;
}

export function registerNotifyCommands(ctl: Command, { connect, print }: CtlHelpers): void {
  const notify = ctl
    .command("notify")
    .description("Notification channels: signed webhooks and Slack, for parked models, lost nodes, budgets, new weights and failed jobs");
  withExamples(
    notify.command("add <name>"),
    "llmgw ctl notify add ops --webhook https://ops.example.com/hooks/llmgw",
    "llmgw ctl notify add team --slack https://hooks.slack.com/services/T000/B000/abc123 --events model_parked,node_lost --min-severity warning",
  )
    .description("Add a channel; a webhook's signing secret (whsec_...) is made unless given, and shown once")
    .option("--webhook <url>", "a URL that takes Standard Webhooks POSTs (signed JSON)")
    .option("--slack <url>", "a Slack incoming-webhook URL")
    .option("--secret <whsec>", "the webhook's signing secret (whsec_ + base64 of 24-64 bytes); default: a new one")
    .option("--events <kinds>", "comma-separated event kinds to send (default: all)")
    .option("--min-severity <level>", "info (default), warning or critical")
    .option("--json", "print JSON")
    .action(async (name: string, options: Options, command: Command) => {
      if ((typeof options.webhook === "string") === (typeof options.slack === "string"))
        throw new BadRequestError("Give exactly one of --webhook URL or --slack URL.");
      const created = await connect(command).call<ChannelView>("POST", "/api/v1/notify", {
        name,
        ...(typeof options.webhook === "string" ? { webhook: options.webhook } : { slack: options.slack }),
        ...(typeof options.secret === "string" ? { secret: options.secret } : {}),
        ...filterFields(options, true),
      });
      print(command, created, () => {
        const line = `Added channel '${created.name}': ${describeChannel(created)}.`;
        if (created.secret === undefined) return `${line}\nSend a test with 'llmgw ctl notify test ${created.name}'.`;
        return `${line}\n\nSigning secret (shown this once; give it to the receiver to verify webhook-signature):\n${created.secret}\n\nSend a test with 'llmgw ctl notify test ${created.name}'.`;
      });
    });
  withExamples(notify.command("list"), "llmgw ctl notify list")
    .description("Channels: kind, where (without secrets), which events, state and deliveries")
    .option("--json", "print JSON")
    .action(async (_options: Options, command: Command) => {
      const { data } = await connect(command).call<{ data: ChannelView[] }>("GET", "/api/v1/notify");
      print(command, data, () =>
        renderTable(
          ["NAME", "KIND", "URL", "EVENTS", "MIN SEVERITY", "STATE", "DELIVERED", "PENDING", "FAILED"],
          data.map((c) => [
            c.name,
            c.kind,
            c.url,
            c.events?.join(",") ?? "all",
            c.min_severity,
            c.enabled ? "enabled" : "disabled",
            c.deliveries?.delivered ?? 0,
            c.deliveries?.pending ?? 0,
            c.deliveries?.failed ?? 0,
          ]),
        ),
      );
    });
  withExamples(
    notify.command("update <name>"),
    "llmgw ctl notify update team --events model_parked,budget_exhausted",
    "llmgw ctl notify update ops --events all --min-severity info",
  )
    .description("Change which events a channel gets")
    .option("--events <kinds>", "comma-separated event kinds, or 'all'")
    .option("--min-severity <level>", "info, warning or critical")
    .option("--json", "print JSON")
    .action(async (name: string, options: Options, command: Command) => {
      const fields = filterFields(options);
      if (Object.keys(fields).length === 0) throw new BadRequestError("Nothing to update: give --events or --min-severity.");
      const updated = await connect(command).call<ChannelView>("PATCH", path(name), fields);
      print(command, updated, () => `Channel '${updated.name}': ${describeChannel(updated)}.`);
    });
  withExamples(notify.command("enable <name>"), "llmgw ctl notify enable ops")
    .description("Send to a channel again after its receiver answered 410 Gone")
    .option("--json", "print JSON")
    .action(async (name: string, _options: Options, command: Command) => {
      const updated = await connect(command).call<ChannelView>("PATCH", path(name), { enabled: true });
      print(command, updated, () => `Channel '${updated.name}' is enabled again: ${describeChannel(updated)}.`);
    });
  withExamples(notify.command("rm <name>"), "llmgw ctl notify rm ops")
    .description("Remove a channel and its delivery log")
    .option("--json", "print JSON")
    .action(async (name: string, _options: Options, command: Command) => {
      const removed = await connect(command).call<{ removed: string }>("DELETE", path(name));
      print(command, removed, () => `Removed channel '${name}'.`);
    });
  withExamples(notify.command("test [name]"), "llmgw ctl notify test ops", "llmgw ctl notify test")
    .description("Send a test message now (to one channel, or to each) and say how each receiver answered; exits 1 when one was not delivered")
    .option("--json", "print JSON")
    .action(async (name: string | undefined, _options: Options, command: Command) => {
      const client = connect(command);
      const names = name !== undefined ? [name] : (await client.call<{ data: ChannelView[] }>("GET", "/api/v1/notify")).data.map((channel) => channel.name);
      if (names.length === 0) throw new BadRequestError("There are no notification channels to test; add one with 'llmgw ctl notify add NAME --webhook URL'.");
      const results: Array<DeliveryView & { channel: string }> = [];
      for (const channel of names) results.push({ channel, ...(await client.call<{ delivery: DeliveryView }>("POST", path(channel, "/test"))).delivery });
      print(command, name === undefined ? results : results[0], () =>
        results
          .map((delivery) =>
            delivery.state === "delivered"
              ? `Delivered: the receiver of '${delivery.channel}' answered ${delivery.last_status}.`
              : `Not delivered to '${delivery.channel}': ${delivery.last_error ?? delivery.state}. Check the URL and that the receiver is up, then test again.`,
          )
          .join("\n"),
      );
      if (results.some((delivery) => delivery.state !== "delivered")) process.exitCode = 1;
    });
  withExamples(notify.command("log <name>"), "llmgw ctl notify log ops --limit 20")
    .description("A channel's deliveries, newest first: event, state, attempts, last answer, next try")
    .option("--limit <n>", "how many (default 50)")
    .option("--json", "print JSON")
    .action(async (name: string, options: Options, command: Command) => {
      const limit = typeof options.limit === "string" ? `?limit=${encodeURIComponent(options.limit)}` : "";
      const { data } = await connect(command).call<{ data: DeliveryView[] }>("GET", path(name, `/log${limit}`));
      print(command, data, () =>
        renderTable(
          ["ID", "CREATED", "KIND", "SUBJECT", "STATE", "ATTEMPTS", "LAST ANSWER", "NEXT TRY"],
          data.map((d) => [d.id, d.created_at, d.kind, d.subject, d.state, d.attempts, d.last_status ?? d.last_error, d.next_attempt_at]),
        ),
      );
    });

  withExamples(ctl.command("events"), "llmgw ctl events --since 24h", "llmgw ctl events --kind model_parked,node_lost --follow")
    .description("Events (parked models, lost nodes, budgets, new weights, failed jobs), newest first; --follow prints new ones as they happen")
    .option("--kind <kinds>", "comma-separated event kinds")
    .option("--since <when>", "an ISO time or a span back from now (30m, 6h, 7d)")
    .option("--limit <n>", "how many (default 100)")
    .option("--follow", "keep printing new events until interrupted")
    .option("--json", "print JSON (one object a line with --follow)")
    .action(async (options: Options, command: Command) => {
      const client = connect(command);
      const query = new URLSearchParams();
      if (typeof options.kind === "string") query.set("kind", options.kind);
      if (options.follow === true) {
        if (options.since !== undefined || options.limit !== undefined)
          throw new BadRequestError("--follow prints events from now on; --since and --limit are for listing past events. Run one, then the other.");
        await followEvents(client, query, (event) => process.stdout.write(`${wantsJson(command) ? JSON.stringify(event) : eventLine(event)}\n`));
        return;
      }
      if (typeof options.since === "string") query.set("since", options.since);
      if (typeof options.limit === "string") query.set("limit", options.limit);
      const { data } = await client.call<{ data: EventView[] }>("GET", `/api/v1/events${query.size > 0 ? `?${query}` : ""}`);
      print(command, data, () => (data.length === 0 ? "No events." : data.map(eventLine).join("\n")));
    });
}

/**
 * Prints events as the server streams them, until interrupted. A stream that ends (the server
 * restarted, or dropped this reader for falling behind) is opened again with the id of the
 * last event printed, so nothing is missed or printed twice.
 */
async function followEvents(client: AdminClient, query: URLSearchParams, print: (event: EventView) => void): Promise<never> {
  let lastId: string | null = null;
  for (;;) {
    try {
      const stream = await client.stream(`/api/v1/events/stream${query.size > 0 ? `?${query}` : ""}`, lastId === null ? {} : { "last-event-id": lastId });
      // Streamed decoding: a character split across two chunks stays whole.
      const decoder = new TextDecoder();
      let buffered = "";
      for await (const chunk of stream) {
        buffered += decoder.decode(chunk, { stream: true });
        for (let end = buffered.indexOf("\n\n"); end >= 0; end = buffered.indexOf("\n\n")) {
          const lines = buffered.slice(0, end).split("\n");
          buffered = buffered.slice(end + 2);
          const data = lines
            .filter((line) => line.startsWith("data: "))
            .map((line) => line.slice(6))
            .join("\n");
          if (data === "") continue;
          lastId = lines.find((line) => line.startsWith("id: "))?.slice(4) ?? lastId;
          print(JSON.parse(data) as EventView);
        }
      }
      process.stderr.write("The event stream ended (the server stopped or dropped this reader); reconnecting...\n");
    } catch (error) {
      // A refusal (a wrong key, a bad --kind) will not change by trying again.
      if (error instanceof LlmgwError && error.status < 500) throw error;
      process.stderr.write(`Lost the event stream (${describeError(error)}); reconnecting...\n`);
    }
    await new Promise((resolve) => setTimeout(resolve, 2000));
  }
}

function eventLine(event: EventView): string {
  return `${event.at}  ${event.severity.toUpperCase().padEnd(8)} ${event.kind.padEnd(19)} ${event.subject}  ${event.message}`;
}
