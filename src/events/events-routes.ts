// The events part of the admin API: GET /api/v1/events (newest first, by kind and time)
// and GET /api/v1/events/stream, server-sent events a console follows. The stream sends
// each event as `id: N` with its JSON as data; a reconnecting client's Last-Event-ID (or
// ?after=N) replays what it missed, at most the last REPLAY_LIMIT events; a comment every
// 15 s keeps proxies from closing it. A reader that falls MAX_QUEUED events behind is
// disconnected (it reconnects with Last-Event-ID and reads on from the table) rather than
// buffered in the server's memory. A stream outlives neither its caller's console session
// nor its key: a logout or a revocation (here, or on another server through the change
// feed) raises `accessChanges`, and every open stream checks its caller again at once.
import type { Context, Env, Hono } from "hono";
import { streamSSE } from "hono/streaming";
import { z } from "zod";
import { BadRequestError, parseWith } from "../core/errors.ts";
import type { ChangeSignal } from "../core/change-signal.ts";
import { parseEventKinds } from "./event-kinds.ts";
import type { EventFollower } from "./event-follower.ts";
import type { EventLog, StoredEvent } from "./event-log.ts";

export interface EventsRoutesOptions {
  events: EventLog;
  follower: EventFollower;
  /** Streams end when this aborts (the server is closing). */
  closing: AbortSignal;
  keepAliveMs?: number;
  /** Raised when a key is revoked or a console session ends: open streams check their caller again. */
  accessChanges?: readonly ChangeSignal[];
}

const REPLAY_LIMIT = 1000;
const MAX_QUEUED = 2000;
/** How stale the caller's authentication may be when an event goes out (see STILL_AUTHORIZED). */
const RECHECK_MS = 5000;

/**
 * The context variable the admin API's auth step sets: checks again that the caller may
 * still read (its key not revoked, its console session not ended); throws when not. A
 * stream runs it at once when `accessChanges` says a key or session changed, before an
 * event once its last check is RECHECK_MS old (an expiry raises no signal), and at each
 * keep-alive.
 */
export const STILL_AUTHORIZED = "stillAuthorized";

declare module "hono" {
  interface ContextVariableMap {
    [STILL_AUTHORIZED]: () => Promise<unknown>;
  }
}

const RELATIVE = /^(\d{1,6})(m|h|d)$/;
const UNIT_MS = { m: 60_000, h: 3_600_000, d: 86_400_000 } as const;

/** An ISO time, or a span back from now: 30m, 6h, 7d. */
function parseSince(value: string, now: number): string {
  const relative = RELATIVE.exec(value);
  if (relative !== null) return new Date(now - Number(relative[1]) * UNIT_MS[relative[2] as keyof typeof UNIT_MS]).toISOString();
  const time = Date.parse(value);
  if (!/^\d{4}-\d{2}-\d{2}/.test(value) || Number.isNaN(time)) {
    throw new BadRequestError(`since: '${value}' is neither an ISO time (2026-12-01T08:00:00Z) nor a span back from now (30m, 6h, 7d).`, {
      code: "invalid_since",
      param: "since",
    });
  }
  return new Date(time).toISOString();
}

const listSchema = z.strictObject({
  kind: z.string().min(1).max(1000).optional(),
  since: z.string().min(1).max(40).optional(),
  limit: z.coerce.number().int().min(1).max(1000).default(100),
});

const streamSchema = z.strictObject({
  kind: z.string().min(1).max(1000).optional(),
  after: z.coerce.number().int().min(0).optional(),
});

function wire(event: StoredEvent): string {
  return JSON.stringify(event);
}

export function mountEventsRoutes<E extends Env>(app: Hono<E>, options: EventsRoutesOptions): void {
  const { events, follower } = options;

  app.get("/api/v1/events", async (c) => {
    const query = parseWith(listSchema, c.req.query(), "events query");
    const kinds = query.kind === undefined ? undefined : parseEventKinds(query.kind, "kind");
    const since = query.since === undefined ? undefined : parseSince(query.since, Date.now());
    return c.json({ data: await events.list({ ...(kinds === undefined ? {} : { kinds }), ...(since === undefined ? {} : { since }), limit: query.limit }) });
  });

  app.get("/api/v1/events/stream", async (c: Context) => {
    const query = parseWith(streamSchema, c.req.query(), "events stream query");
    const kinds = query.kind === undefined ? null : new Set<string>(parseEventKinds(query.kind, "kind"));
    const lastEventId = c.req.header("last-event-id");
    // The header first: an EventSource opened with ?after=N sends the same URL on every reconnect.
    const resumeFrom = lastEventId !== undefined && /^\d{1,15}$/.test(lastEventId) ? Number(lastEventId) : (query.after ?? null);
    const latest = await events.latestId();
    // A new reader starts from now; a resuming one from where it was, within the replay limit.
    const start = resumeFrom === null ? latest : Math.max(resumeFrom, latest - REPLAY_LIMIT);
    return streamSSE(c, async (stream) => {
      const queue: StoredEvent[] = [];
      let tooSlow = false;
      let wake: (() => void) | null = null;
      const nudge = () => {
        wake?.();
        wake = null;
      };
      const unsubscribe = follower.subscribe(start, (event) => {
        if (kinds !== null && !kinds.has(event.kind)) return;
        // Once one event is dropped, every later one is too: the client resumes from the last it got.
        if (tooSlow || queue.length >= MAX_QUEUED) {
          tooSlow = true;
          return;
        }
        queue.push(event);
        nudge();
      });
      const closed = () => stream.closed || c.req.raw.signal.aborted || options.closing.aborted || (tooSlow && queue.length === 0);
      stream.onAbort(nudge);
      c.req.raw.signal.addEventListener("abort", nudge, { once: true });
      options.closing.addEventListener("abort", nudge, { once: true });
      // Flags, not only wake-ups: a change or a keep-alive that comes while an event is being
      // written is seen when the loop comes round.
      let accessChanged = false;
      let keepAliveDue = false;
      const unsubscribeAccess = (options.accessChanges ?? []).map((signal) =>
        signal.subscribe(() => {
          accessChanged = true;
          nudge();
        }),
      );
      const keepAlive = setInterval(() => {
        keepAliveDue = true;
        nudge();
      }, options.keepAliveMs ?? 15_000);
      keepAlive.unref();
      const stillAuthorized: (() => Promise<unknown>) | undefined = c.get(STILL_AUTHORIZED);
      let checkedAt = Date.now();
      const authorized = async (force: boolean): Promise<boolean> => {
        if (stillAuthorized === undefined || (!force && Date.now() - checkedAt < RECHECK_MS)) return true;
        try {
          await stillAuthorized();
          checkedAt = Date.now();
          return true;
        } catch {
          return false;
        }
      };
      try {
        // The first line tells the client the stream is open (and how soon to reconnect).
        await stream.write(`retry: 2000\n: llmgw events from id ${start}\n\n`);
        while (!closed()) {
          if (accessChanged) {
            accessChanged = false;
            // Ending the stream is the answer: the client reconnects and is asked for its key or session again.
            if (!(await authorized(true))) break;
            continue;
          }
          if (queue.length === 0) {
            if (!keepAliveDue) {
              await new Promise<void>((resolve) => {
                wake = resolve;
              });
            }
            if (keepAliveDue && queue.length === 0 && !closed()) {
              keepAliveDue = false;
              if (!(await authorized(true))) break;
              await stream.write(": keep-alive\n\n");
            }
            continue;
          }
          if (!(await authorized(false))) break;
          const event = queue.shift()!;
          await stream.writeSSE({ id: String(event.id), data: wire(event) });
        }
      } finally {
        clearInterval(keepAlive);
        for (const stop of unsubscribeAccess) stop();
        unsubscribe();
        options.closing.removeEventListener("abort", nudge);
      }
    });
  });
}
