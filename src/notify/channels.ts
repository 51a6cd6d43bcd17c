// Notification channels: where events go (a signed webhook or a Slack incoming webhook),
// which kinds and from which severity. URLs and signing secrets are sealed with the
// server's secret box: they are credentials, so the API shows a URL's scheme, host and
// first path segment only (a Slack URL's host only) and a generated secret once, at creation. Every
// change is audited in the same transaction. A URL with a user name or password in it is
// refused, and so is one on a private network unless the server allows those
// (webhook-address.ts).
import { randomUUID } from "node:crypto";
import { z } from "zod";
import { ConflictError, NotFoundError, BadRequestError, parseWith } from "../core/errors.ts";
import type { SecretBox } from "../core/secret-box.ts";
import { parseEventKinds, SEVERITIES, type EventKind, type Severity } from "../events/event-kinds.ts";
import { recordAudit } from "../store/audit.ts";
import { nowIso, type Store } from "../store/store.ts";
import { checkReceiverAddress, type WebhookAddressPolicy } from "./webhook-address.ts";
import { generateWebhookSecret, webhookSecretKey } from "./webhook-signing.ts";

export const CHANNEL_NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;

const urlSchema = z.string().max(2048, "is at most 2048 characters");

const createSchema = z
  .strictObject({
    name: z.string({ error: "is required" }).regex(CHANNEL_NAME_PATTERN, "must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"),
    webhook: urlSchema.optional(),
    slack: urlSchema.optional(),
    secret: z.string().max(200).optional(),
    events: z.union([z.string(), z.array(z.string())]).optional(),
    min_severity: z.enum(SEVERITIES).default("info"),
  })
  .refine((body) => (body.webhook === undefined) !== (body.slack === undefined), {
    message: "give exactly one of 'webhook' (a URL) or 'slack' (an incoming-webhook URL)",
  })
  .refine((body) => body.secret === undefined || body.webhook !== undefined, {
    message: "'secret' signs webhooks; a Slack channel has none",
    path: ["secret"],
  });

const updateSchema = z.strictObject({
  enabled: z.literal(true).optional(),
  events: z
    .union([z.string(), z.array(z.string())])
    .nullable()
    .optional(),
  min_severity: z.enum(SEVERITIES).optional(),
});

export interface Channel {
  id: string;
  name: string;
  kind: "webhook" | "slack";
  events: EventKind[] | null;
  minSeverity: Severity;
  disabledAt: string | null;
  disabledReason: string | null;
  urlShown: string;
  createdBy: string;
  createdAt: string;
  urlSealed: string;
  secretSealed: string | null;
}

/** What the API shows of a channel: never its full URL or its secret. */
export interface ChannelView {
  name: string;
  kind: "webhook" | "slack";
  url: string;
  events: EventKind[] | null;
  min_severity: Severity;
  enabled: boolean;
  disabled_at: string | null;
  disabled_reason: string | null;
  created_by: string;
  created_at: string;
}

export function viewChannel(channel: Channel): ChannelView {
  return {
    name: channel.name,
    kind: channel.kind,
    url: channel.urlShown,
    events: channel.events,
    min_severity: channel.minSeverity,
    enabled: channel.disabledAt === null,
    disabled_at: channel.disabledAt,
    disabled_reason: channel.disabledReason,
    created_by: channel.createdBy,
    created_at: channel.createdAt,
  };
}

/** Checks a receiver URL's form; returns it parsed and what may be shown of it. */
function checkUrl(value: string, param: "webhook" | "slack"): { url: URL; shown: string } {
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    throw new BadRequestError(`${param}: '${value.slice(0, 80)}' is not a URL; give the receiver's full address, such as https://example.com/hooks/llmgw.`, {
      code: "invalid_url",
      param,
    });
  }
  if (url.protocol !== "https:" && url.protocol !== "http:") {
    throw new BadRequestError(`${param}: the URL must be http or https, not ${url.protocol.replace(":", "")}.`, { code: "invalid_url", param });
  }
  // fetch-style clients drop a URL's user part rather than send it as Basic auth: the
  // receiver would never see the credential it expects, and nothing would say so.
  if (url.username !== "" || url.password !== "") {
    const where =
      param === "webhook"
        ? "a receiver authenticates llmgw by the Standard Webhooks signature made with the channel's signing secret ('secret', or --secret), or by a token in the URL's path or query (kept sealed and never shown)"
        : "a Slack incoming-webhook URL carries its credential in its path";
    throw new BadRequestError(`${param}: the URL has a user name or password in it (user:password@host), which llmgw does not send; remove it: ${where}.`, {
      code: "webhook_url_userinfo",
      param,
    });
  }
  // A Slack incoming-webhook URL is a credential in its path. Webhook receivers often are
  // too (tokens in later path segments: /api/webhooks/ID/TOKEN, /hooks/KEY; in the query):
  // only the host and the first path segment are shown.
  if (param === "slack") return { url, shown: `${url.protocol}//${url.host}/…` };
  const segments = url.pathname.split("/").filter((segment) => segment !== "");
  const shownPath = segments.length === 0 ? "/" : `/${segments[0]}${segments.length > 1 ? "/…" : ""}`;
  return { url, shown: `${url.protocol}//${url.host}${shownPath}${url.search === "" ? "" : "?…"}` };
}

export class ChannelStore {
  constructor(
    private readonly options: {
      store: Store;
      box: SecretBox;
      clock?: () => number;
      /** Which receiver addresses are allowed (default: public ones only). */
      addresses?: WebhookAddressPolicy;
    },
  ) {}

  /** Creates a channel; `secret` is the webhook's signing secret, shown this once (null for Slack). */
  async create(body: unknown, actor: string): Promise<{ channel: ChannelView; secret: string | null }> {
    const request = parseWith(createSchema, body, "notification channel");
    const kind = request.webhook !== undefined ? "webhook" : "slack";
    const url = (request.webhook ?? request.slack)!;
    const { url: parsed, shown: urlShown } = checkUrl(url, kind);
    const secret = kind === "webhook" ? (request.secret ?? generateWebhookSecret()) : null;
    if (secret !== null) webhookSecretKey(secret);
    const events = request.events === undefined ? null : parseEventKinds(request.events, "events");
    // Last: it may ask DNS, so the checks of the request's own fields answer first.
    await checkReceiverAddress(parsed, kind, this.options.addresses ?? { allowPrivate: false });
    const { box } = this.options;
    const row = {
      id: randomUUID(),
      name: request.name,
      kind,
      url_sealed: box.seal(url),
      url_shown: urlShown,
      secret_sealed: secret === null ? null : box.seal(secret),
      events: events === null ? null : JSON.stringify(events),
      min_severity: request.min_severity,
      disabled_at: null,
      disabled_reason: null,
      created_by: actor,
      created_at: nowIso(this.options.clock),
    };
    await this.options.store.db.transaction().execute(async (trx) => {
      const existing = await trx.selectFrom("notify_channels").select("id").where("name", "=", request.name).executeTakeFirst();
      if (existing !== undefined) {
        throw new ConflictError(
          `A notification channel named '${request.name}' exists; remove it first ('llmgw ctl notify rm ${request.name}') or choose another name.`,
          { code: "channel_exists", param: "name" },
        );
      }
      await trx.insertInto("notify_channels").values(row).execute();
      await recordAudit(trx, {
        at: row.created_at,
        actor,
        action: "notify.add",
        target: request.name,
        detail: { kind, url: urlShown, events, min_severity: request.min_severity },
      });
    });
    return { channel: viewChannel(toChannel(row)), secret: request.secret === undefined ? secret : null };
  }

  async list(): Promise<Channel[]> {
    return (await this.options.store.db.selectFrom("notify_channels").selectAll().orderBy("name").execute()).map(toChannel);
  }

  async get(name: string): Promise<Channel> {
    const row = await this.options.store.db.selectFrom("notify_channels").selectAll().where("name", "=", name).executeTakeFirst();
    if (row === undefined)
      throw new NotFoundError(`There is no notification channel named '${name}'. List them with 'llmgw ctl notify list'.`, { code: "channel_not_found" });
    return toChannel(row);
  }

  /** Removes the channel and its delivery log. */
  async remove(name: string, actor: string): Promise<void> {
    const channel = await this.get(name);
    await this.options.store.db.transaction().execute(async (trx) => {
      await trx.deleteFrom("notify_deliveries").where("channel_id", "=", channel.id).execute();
      await trx.deleteFrom("notify_channels").where("id", "=", channel.id).execute();
      await recordAudit(trx, { at: nowIso(this.options.clock), actor, action: "notify.remove", target: name, detail: { kind: channel.kind } });
    });
  }

  /** Changes which events a channel takes, or enables it again after a 410. */
  async update(name: string, body: unknown, actor: string): Promise<ChannelView> {
    const request = parseWith(updateSchema, body, "notification channel change");
    const channel = await this.get(name);
    const change: { events?: string | null; min_severity?: Severity; disabled_at?: null; disabled_reason?: null } = {};
    if (request.events !== undefined) change.events = request.events === null ? null : JSON.stringify(parseEventKinds(request.events, "events"));
    if (request.min_severity !== undefined) change.min_severity = request.min_severity;
    if (request.enabled === true) Object.assign(change, { disabled_at: null, disabled_reason: null });
    if (Object.keys(change).length === 0)
      throw new BadRequestError("The change names nothing to change: give 'enabled', 'events' or 'min_severity'.", { code: "empty_change" });
    await this.options.store.db.transaction().execute(async (trx) => {
      await trx.updateTable("notify_channels").set(change).where("id", "=", channel.id).execute();
      await recordAudit(trx, { at: nowIso(this.options.clock), actor, action: "notify.update", target: name, detail: request });
    });
    return viewChannel(await this.get(name));
  }

  /** After a 410: nothing more is sent until an operator enables it again. */
  async disable(channelId: string, reason: string): Promise<void> {
    await this.options.store.db
      .updateTable("notify_channels")
      .set({ disabled_at: nowIso(this.options.clock), disabled_reason: reason })
      .where("id", "=", channelId)
      .execute();
  }

  /** The URL and signing key, for the sender only; null when sealed with another server secret. */
  openTarget(channel: Channel): { url: string; key: Buffer | null } | null {
    const url = this.options.box.open(channel.urlSealed);
    const secret = channel.secretSealed === null ? null : this.options.box.open(channel.secretSealed);
    if (url === null || (channel.secretSealed !== null && secret === null)) return null;
    return { url, key: secret === null ? null : webhookSecretKey(secret) };
  }
}

type ChannelRow = {
  id: string;
  name: string;
  kind: string;
  url_sealed: string;
  url_shown: string;
  secret_sealed: string | null;
  events: string | null;
  min_severity: string;
  disabled_at: string | null;
  disabled_reason: string | null;
  created_by: string;
  created_at: string;
};

function toChannel(row: ChannelRow): Channel {
  return {
    id: row.id,
    name: row.name,
    kind: row.kind as Channel["kind"],
    events: row.events === null ? null : (JSON.parse(row.events) as EventKind[]),
    minSeverity: row.min_severity as Severity,
    disabledAt: row.disabled_at,
    disabledReason: row.disabled_reason,
    urlShown: row.url_shown,
    createdBy: row.created_by,
    createdAt: row.created_at,
    urlSealed: row.url_sealed,
    secretSealed: row.secret_sealed,
  };
}
