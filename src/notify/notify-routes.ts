// The notification part of the admin API, under /api/v1/notify: channels (add, list,
// show, change, remove), a test message, and each channel's delivery log. A webhook's
// generated secret is in the creation's answer only; URLs are shown without their
// secret parts (channels.ts).
import type { Context, Hono } from "hono";
import { z } from "zod";
import { parseWith } from "../core/errors.ts";
import type { Principal } from "../keys/key-service.ts";
import { viewChannel, type Channel, type ChannelStore } from "./channels.ts";
import type { Notifier } from "./notifier.ts";

type Env = { Variables: { principal: Principal } };

export interface NotifyRoutesOptions {
  channels: ChannelStore;
  notifier: Notifier;
  jsonBody: (c: Context) => Promise<unknown>;
  actor: (c: Context<Env>) => string;
}

const logQuerySchema = z.strictObject({ limit: z.coerce.number().int().min(1).max(1000).default(50) });

export function mountNotifyRoutes(app: Hono<Env>, options: NotifyRoutesOptions): void {
  const { channels, notifier, actor } = options;
  const withCounts = async (channel: Channel) => ({ ...viewChannel(channel), deliveries: await notifier.deliveries.counts(channel.id) });

  app.get("/api/v1/notify", async (c) => c.json({ data: await Promise.all((await channels.list()).map(withCounts)) }));
  app.post("/api/v1/notify", async (c) => {
    const { channel, secret } = await channels.create(await options.jsonBody(c), actor(c));
    return c.json({ ...channel, ...(secret === null ? {} : { secret }) }, 201);
  });
  app.get("/api/v1/notify/:name", async (c) => c.json(await withCounts(await channels.get(c.req.param("name")))));
  app.patch("/api/v1/notify/:name", async (c) => c.json(await channels.update(c.req.param("name"), await options.jsonBody(c), actor(c))));
  app.delete("/api/v1/notify/:name", async (c) => {
    await channels.remove(c.req.param("name"), actor(c));
    return c.json({ removed: c.req.param("name") });
  });
  app.post("/api/v1/notify/:name/test", async (c) => c.json({ delivery: await notifier.test(c.req.param("name"), actor(c)) }));
  app.get("/api/v1/notify/:name/log", async (c) => {
    const channel = await channels.get(c.req.param("name"));
    const query = parseWith(logQuerySchema, c.req.query(), "delivery log query");
    return c.json({ channel: channel.name, data: await notifier.deliveries.log(channel.id, query.limit) });
  });
}
