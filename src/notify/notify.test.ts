// Notifications end to end inside one process: a real server (SQLite), events recorded
// through its event log, and loopback receivers that check signatures with the
// `standardwebhooks` package. Covers channels (secrets shown once, refused inputs),
// signing, retries with a stable webhook-id, the hourly de-duplication, a 410 that
// disables a channel, filters, a restart with deliveries pending, Slack's message shape,
// the test message and the events API and stream.
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { readFileSync } from "node:fs";
import path from "node:path";
import { settled } from "./notifier.ts";
import { dropSchema, postgresSchemaOrSkip } from "../../test/support/stores.ts";
import { eventually } from "../../test/support/eventually.ts";
import { startHarness, type Harness } from "../../test/support/server-harness.ts";
import { startReceiver, type Receiver } from "../../test/support/webhook-receiver.ts";

const FAST = { notify: { backoffMs: 50, maxBackoffMs: 200, pollMs: 50 } };
// For the restart tests: the first server must not retry before it stops, or that attempt
// (aborted by the stop, or answered and then sent again) would be what the test sees.
const RETRY_IN_A_MINUTE = { notify: { backoffMs: 60_000, maxBackoffMs: 60_000, pollMs: 50 } };
/**
 * Whether the delivery of `kind` failed once and waits for its retry. A row is pending from
 * its creation, before any attempt, so the state alone does not say the attempt is over.
 */
async function failedOnce(harness: Harness, kind: string): Promise<boolean> {
  const rows: Array<{ kind: string; state: string; attempts: number; last_status: number | null }> = (await harness.admin("GET", "/api/v1/notify/ops/log")).body
    .data;
  const row = rows.find((d) => d.kind === kind);
  return row?.state === "pending" && row.attempts === 1 && row.last_status === 500;
}
/** The minute passes for the restarted server: pending retries come due now. */
async function theMinutePasses(harness: Harness): Promise<void> {
  await harness.server.store.db.updateTable("notify_deliveries").set({ next_attempt_at: new Date().toISOString() }).where("state", "=", "pending").execute();
}
const open: Array<{ close(): Promise<void> }> = [];
after(async () => {
  for (const item of open.reverse()) await item.close().catch(() => undefined);
});

async function setup(options: Parameters<typeof startHarness>[0] = {}): Promise<{ harness: Harness; receiver: Receiver }> {
  const receiver = await startReceiver();
  const harness = await startHarness({ notify: FAST, ...options });
  open.push(receiver, harness);
  return { harness, receiver };
}

async function addWebhook(harness: Harness, receiver: Receiver, extra: Record<string, unknown> = {}): Promise<string> {
  const created = await harness.admin("POST", "/api/v1/notify", { name: "ops", webhook: receiver.url, ...extra });
  assert.equal(created.status, 201, JSON.stringify(created.body));
  receiver.secret = (extra.secret as string | undefined) ?? created.body.secret;
  return created.body.secret;
}

test("a webhook channel's secret is shown once, its URL without its query, and nothing secret is stored in the clear", async () => {
  const { harness, receiver } = await setup();
  const created = await harness.admin("POST", "/api/v1/notify", {
    name: "ops",
    webhook: `${receiver.url}?token=s3cr3t-token`,
    events: "model_parked,node_lost",
    min_severity: "warning",
  });
  assert.equal(created.status, 201);
  assert.match(created.body.secret, /^whsec_[A-Za-z0-9+/]+=*$/);
  assert.equal(Buffer.from(created.body.secret.slice(6), "base64").length, 32);
  assert.equal(
    created.body.url,
    `${receiver.url.replace(/\/hooks\/llmgw$/, "")}/hooks/…?…`,
    "host and first path segment only: later segments often hold tokens",
  );
  assert.deepEqual(created.body.events, ["model_parked", "node_lost"]);
  for (const read of [await harness.admin("GET", "/api/v1/notify/ops"), await harness.admin("GET", "/api/v1/notify")]) {
    const text = JSON.stringify(read.body);
    assert.equal(read.status, 200);
    assert.ok(!text.includes(created.body.secret), "the secret is never shown again");
    assert.ok(!text.includes("s3cr3t-token"), "the URL's query is never shown");
  }
  const slack = await harness.admin("POST", "/api/v1/notify", { name: "team", slack: "https://hooks.slack.com/services/T000/B000/XYZsecretpath" });
  assert.equal(slack.status, 201);
  assert.equal(slack.body.secret, undefined);
  assert.equal(slack.body.url, "https://hooks.slack.com/…");
  await harness.server.close();
  const database = readFileSync(path.join(harness.dataDir, "llmgw.db"));
  for (const secret of [created.body.secret, "s3cr3t-token", "XYZsecretpath"])
    assert.equal(database.includes(Buffer.from(secret)), false, `${secret} is sealed in the store`);
});

test("bad channel requests are refused naming what is wrong", async () => {
  const { harness, receiver } = await setup();
  const cases: Array<[Record<string, unknown>, number, RegExp]> = [
    [{ name: "a", webhook: receiver.url, events: "model_parked,model_exploded" }, 400, /'model_exploded' is not an event kind; choose from model_parked/],
    [{ name: "a", webhook: "ftp://example.com/x" }, 400, /must be http or https/],
    [{ name: "a", webhook: "not a url" }, 400, /is not a URL/],
    [{ name: "a", webhook: receiver.url, slack: receiver.url }, 400, /exactly one of 'webhook'/],
    [{ name: "a", slack: receiver.url, secret: "whsec_AAAA" }, 400, /a Slack channel has none/],
    [{ name: "a", webhook: receiver.url, secret: "hunter2" }, 400, /must start with 'whsec_'/],
    [{ name: "a", webhook: receiver.url, secret: "whsec_AAAA" }, 400, /decodes to 3 bytes/],
    [{ name: "a b", webhook: receiver.url }, 400, /name/],
    [{ name: "a", webhook: receiver.url, min_severity: "loud" }, 400, /min_severity/],
  ];
  for (const [body, status, message] of cases) {
    const answer = await harness.admin("POST", "/api/v1/notify", body);
    assert.equal(answer.status, status, JSON.stringify(body));
    assert.match(answer.body.error.message, message);
  }
  await addWebhook(harness, receiver);
  const again = await harness.admin("POST", "/api/v1/notify", { name: "ops", webhook: receiver.url });
  assert.equal(again.status, 409);
  assert.match(again.body.error.message, /llmgw ctl notify rm ops/);
  assert.equal((await harness.admin("GET", "/api/v1/notify/nope")).status, 404);
  assert.equal((await harness.admin("GET", "/api/v1/events?kind=nope")).status, 400);
  assert.match((await harness.admin("GET", "/api/v1/events?since=yesterday")).body.error.message, /span back from now/);
});

test("an event reaches a webhook signed as Standard Webhooks; 500s are retried with the same webhook-id until it is taken", async () => {
  const { harness, receiver } = await setup();
  await addWebhook(harness, receiver);
  receiver.answers = [500, 503];
  await harness.server.events.record({ kind: "node_lost", subject: "node:gpu-1", data: { node: "gpu-1" }, message: "Node 'gpu-1' sent no heartbeat." });
  const [delivered] = await eventually("the third attempt is taken", () => receiver.webhooks().length === 1 && receiver.webhooks());
  assert.equal(delivered!.verified, true, delivered!.verifyError ?? "");
  // The receiver logs a request before its answer reaches the notifier: the row says delivered a moment later.
  await eventually("the delivery is recorded", async () => (await harness.admin("GET", "/api/v1/notify/ops/log")).body.data[0]?.state === "delivered");
  assert.deepEqual(
    receiver.requests.map((request) => request.status),
    [500, 503, 200],
  );
  assert.equal(new Set(receiver.requests.map((request) => request.headers["webhook-id"])).size, 1, "one message id across retries");
  assert.equal(delivered!.body.type, "node_lost");
  assert.equal(delivered!.body.data.node, "gpu-1");
  assert.equal(delivered!.body.data.severity, "warning");
  assert.ok(!Number.isNaN(Date.parse(delivered!.body.timestamp)));
  const log = await harness.admin("GET", "/api/v1/notify/ops/log");
  assert.equal(log.body.data.length, 1);
  assert.equal(log.body.data[0].state, "delivered");
  assert.equal(log.body.data[0].attempts, 3);
  assert.equal(log.body.data[0].last_status, 200);
  // A signature made with another secret is refused by the same verifier: the check above means something.
  receiver.secret = `whsec_${Buffer.alloc(32, 7).toString("base64")}`;
  assert.equal(receiver.webhooks()[0]!.verified, false);
});

test("a receiver that does not answer in time is cut off and tried again", async () => {
  const { harness, receiver } = await setup({ notify: { notify: { ...FAST.notify, timeoutMs: 1000 } } });
  await addWebhook(harness, receiver);
  receiver.answers = [0];
  await harness.server.events.record({ kind: "job_failed", subject: "job:j1", data: { job: "j1" }, message: "failed" });
  await eventually("the second attempt is taken", () => receiver.webhooks().length === 1);
  assert.equal(receiver.requests.length, 2);
  const log = await eventually("the delivery is recorded", async () => {
    const row = (await harness.admin("GET", "/api/v1/notify/ops/log")).body.data[0];
    return row?.state === "delivered" && row;
  });
  assert.equal(log.attempts, 2);
  const first = await harness.server.store.db.selectFrom("notify_deliveries").select("last_error").executeTakeFirstOrThrow();
  assert.equal(first.last_error, null, "a delivered row keeps no error");
});

test("a delivery that keeps failing is given up when its time is over, saying how often it was tried", async () => {
  const { harness, receiver } = await setup({ notify: { notify: { backoffMs: 20, maxBackoffMs: 40, pollMs: 20, giveUpMs: 2000 } } });
  await addWebhook(harness, receiver);
  receiver.answers = Array.from({ length: 1000 }, () => 500);
  await harness.server.events.record({ kind: "node_lost", subject: "node:x", message: "lost" });
  const given = await eventually("given up", async () => {
    const row = (await harness.admin("GET", "/api/v1/notify/ops/log")).body.data[0];
    return row?.state === "failed" && row;
  });
  assert.match(given.last_error, /^given up after \d+ attempts: the receiver answered 500/);
  assert.ok(given.attempts >= 2, `retried before giving up: ${given.attempts}`);
  assert.equal(given.next_attempt_at, null);
  const sent = receiver.requests.length;
  await harness.server.notifier.idle();
  assert.equal(receiver.requests.length, sent, "nothing more is sent");
});

test("one kind about one subject is sent once an hour; other subjects and kinds still go", async () => {
  const { harness, receiver } = await setup();
  await addWebhook(harness, receiver);
  const events = harness.server.events;
  for (let i = 0; i < 3; i++) {
    await events.record({ kind: "node_lost", subject: "node:flappy", message: "lost" });
    await events.record({ kind: "node_back", subject: "node:flappy", message: "back" });
  }
  await events.record({ kind: "node_lost", subject: "node:other", message: "lost" });
  await eventually("three deliveries", () => receiver.webhooks().length >= 3);
  await harness.server.notifier.idle();
  // Whatever arrives after the pass that fanned them out would be a duplicate.
  await eventually("no delivery is pending", async () => (await harness.admin("GET", "/api/v1/notify/ops")).body.deliveries.pending === 0);
  const sent = receiver
    .webhooks()
    .map((hook) => `${hook.body.type} ${hook.body.data.subject}`)
    .sort();
  assert.deepEqual(sent, ["node_back node:flappy", "node_lost node:flappy", "node_lost node:other"]);
});

test("a channel only gets the kinds and severities it asked for", async () => {
  const { harness, receiver } = await setup();
  await addWebhook(harness, receiver, { events: ["model_parked", "node_back"], min_severity: "warning" });
  await harness.server.events.record({ kind: "node_back", subject: "node:a", message: "back (info: below the minimum)" });
  await harness.server.events.record({ kind: "node_lost", subject: "node:a", message: "lost (not a kind asked for)" });
  await harness.server.events.record({ kind: "model_parked", subject: "model:m", message: "parked" });
  await eventually("the parked model arrives", () => receiver.webhooks().length === 1);
  await harness.server.notifier.idle();
  await harness.server.events.record({ kind: "model_parked", subject: "model:other", message: "parked too" });
  await eventually("the second parked model arrives", () => receiver.webhooks().length === 2);
  assert.deepEqual(
    receiver.webhooks().map((hook) => hook.body.type),
    ["model_parked", "model_parked"],
  );
});

test("a 410 disables the channel and cancels what waits; enabling it sends again", async () => {
  const { harness, receiver } = await setup();
  await addWebhook(harness, receiver);
  receiver.answers = [410];
  await harness.server.events.record({ kind: "node_lost", subject: "node:a", message: "lost" });
  const disabled = await eventually("the channel is disabled", async () => {
    const channel = (await harness.admin("GET", "/api/v1/notify/ops")).body;
    return channel.enabled === false && channel;
  });
  assert.match(disabled.disabled_reason, /410 Gone/);
  await harness.server.events.record({ kind: "node_lost", subject: "node:b", message: "lost while disabled" });
  await harness.server.notifier.idle();
  await eventually("the cursor passed the event", async () => {
    await harness.server.notifier.idle();
    const cursor = await harness.server.store.db.selectFrom("notify_cursor").select("last_event_id").executeTakeFirstOrThrow();
    return Number(cursor.last_event_id) === (await harness.server.events.latestId());
  });
  assert.equal(receiver.requests.length, 1, "nothing is sent to a disabled channel");
  const log = (await harness.admin("GET", "/api/v1/notify/ops/log")).body.data;
  assert.equal(log[0].state, "failed");
  assert.equal(log[0].last_status, 410);
  const enabled = await harness.admin("PATCH", "/api/v1/notify/ops", { enabled: true });
  assert.equal(enabled.body.enabled, true);
  // The same kind about the same subject within the hour: the 410'd delivery never arrived, so this one is not a repeat.
  await harness.server.events.record({ kind: "node_lost", subject: "node:a", message: "lost again" });
  await eventually("sent once enabled", () => receiver.webhooks().length === 1);
  assert.equal(receiver.webhooks()[0]!.body.data.subject, "node:a");
  assert.equal(receiver.webhooks()[0]!.body.data.message, "lost again");
});

test("deliveries pending at a stop are sent after the restart", async () => {
  const receiver = await startReceiver();
  open.push(receiver);
  const first = await startHarness({ notify: RETRY_IN_A_MINUTE });
  const secret = await addWebhook(first, receiver);
  receiver.answers = [500];
  await first.server.events.record({ kind: "model_parked", subject: "model:m", data: { model: "m" }, message: "parked" });
  await eventually("the first attempt failed", () => receiver.requests.length === 1);
  await eventually("the failure is recorded", async () => failedOnce(first, "model_parked"));
  await first.server.close();
  const second = await startHarness({ dataDir: first.dataDir, adminKey: first.adminKey, notify: FAST });
  open.push(second);
  await theMinutePasses(second);
  const [hook] = await eventually("delivered after the restart", () => receiver.webhooks().length === 1 && receiver.webhooks());
  receiver.secret = secret;
  assert.equal(hook!.verified, true);
  assert.equal(hook!.body.type, "model_parked");
  assert.equal(receiver.requests[0]!.headers["webhook-id"], receiver.requests[1]!.headers["webhook-id"]);
});

test("Slack gets a readable message with a link to the console, escaped, unsigned", async () => {
  const { harness, receiver } = await setup({ notify: { ...FAST, publicUrl: "https://llmgw.example.com/" } });
  assert.equal((await harness.admin("POST", "/api/v1/notify", { name: "team", slack: receiver.url })).status, 201);
  await harness.server.events.record({
    kind: "model_parked",
    subject: "model:<tiny>",
    data: { model: "<tiny>" },
    message: "Model '<tiny>' is parked: crash & burn.",
  });
  const [message] = await eventually("the Slack message arrives", () => receiver.messages().length === 1 && receiver.messages());
  assert.equal(receiver.requests[0]!.headers["webhook-signature"], undefined);
  assert.equal(receiver.requests[0]!.headers["content-type"], "application/json");
  assert.match(message!.text, /^Model parked: Model '&lt;tiny&gt;' is parked: crash &amp; burn\./);
  const section = message!.blocks.find((block) => block.type === "section")!;
  assert.equal(section.text!.type, "mrkdwn");
  assert.match(section.text!.text, /\*Model parked\* \(critical\)/);
  assert.match(section.text!.text, /Model '&lt;tiny&gt;' is parked: crash &amp; burn\./);
  const context = message!.blocks.find((block) => block.type === "context")!;
  assert.match(context.elements![0]!.text, /<https:\/\/llmgw\.example\.com\/#\/models\|Open the llmgw console>/);
});

test("an event's text cannot ping a Slack channel or hide a link: the text field is escaped like the blocks", async () => {
  const { harness, receiver } = await setup({ notify: { ...FAST, publicUrl: "https://llmgw.example.com/a|b" } });
  assert.equal((await harness.admin("POST", "/api/v1/notify", { name: "team", slack: receiver.url })).status, 201);
  // A node's last error, quoted in the event's message, carrying Slack markup.
  const lastError = "<!channel> <https://x|Click>";
  await harness.server.events.record({
    kind: "node_lost",
    subject: "node:<!here>",
    data: { node: "<!here>" },
    message: `Node 'gpu-1' sent no heartbeat; its last error: ${lastError}`,
  });
  const [message] = await eventually("the Slack message arrives", () => receiver.messages().length === 1 && receiver.messages());
  assert.equal(message!.text, "Node lost: Node 'gpu-1' sent no heartbeat; its last error: &lt;!channel&gt; &lt;https://x|Click&gt;");
  const section = message!.blocks.find((block) => block.type === "section")!.text!.text;
  const context = message!.blocks.find((block) => block.type === "context")!.elements![0]!.text;
  for (const text of [message!.text, section]) {
    assert.ok(text.includes("&lt;!channel&gt;"), text);
    assert.ok(!text.includes("<!"), `no raw Slack command in: ${text}`);
    assert.ok(!text.includes("<https://x"), `no raw link in: ${text}`);
  }
  assert.match(section, /· node:&lt;!here&gt;\n/);
  // A '|' in --public-url would end the link's URL early: it is encoded.
  assert.match(context, /^<https:\/\/llmgw\.example\.com\/a%7Cb\/#\/nodes\|Open the llmgw console>/);
});

test("a test message goes out at once and shows in the log; a failing one says how the receiver answered", async () => {
  const { harness, receiver } = await setup();
  await addWebhook(harness, receiver);
  const sent = await harness.admin("POST", "/api/v1/notify/ops/test");
  assert.equal(sent.status, 200);
  assert.equal(sent.body.delivery.state, "delivered");
  assert.equal(receiver.webhooks()[0]!.body.type, "notify_test");
  assert.equal(receiver.webhooks()[0]!.verified, true);
  receiver.answers = [500];
  const failed = await harness.admin("POST", "/api/v1/notify/ops/test");
  assert.equal(failed.body.delivery.state, "failed");
  assert.match(failed.body.delivery.last_error, /answered 500/);
  const audit = await harness.admin("GET", "/api/v1/audit?action=notify.");
  assert.deepEqual(
    audit.body.data.map((entry: { action: string }) => entry.action),
    ["notify.test", "notify.test", "notify.add"],
  );
  assert.equal((await harness.admin("DELETE", "/api/v1/notify/ops")).status, 200);
  assert.equal((await harness.admin("GET", "/api/v1/notify")).body.data.length, 0);
});

test("the events API filters by kind and time; the stream sends new events and replays from Last-Event-ID", async () => {
  const { harness } = await setup();
  const events = harness.server.events;
  await events.record({ kind: "node_lost", subject: "node:a", message: "lost" });
  await events.record({ kind: "job_failed", subject: "job:1", data: { job: "1" }, message: "failed" });
  const listed = await harness.admin("GET", "/api/v1/events?kind=job_failed,node_lost&since=1h");
  assert.deepEqual(
    listed.body.data.map((event: { kind: string }) => event.kind),
    ["job_failed", "node_lost"],
  );
  assert.equal(listed.body.data[0].data.job, "1");
  assert.equal((await harness.admin("GET", `/api/v1/events?since=${new Date(Date.now() + 60_000).toISOString()}`)).body.data.length, 0);

  const controller = new AbortController();
  const response = await fetch(`${harness.url}/api/v1/events/stream?kind=model_parked`, {
    headers: { authorization: `Bearer ${harness.adminKey}` },
    signal: controller.signal,
  });
  assert.equal(response.status, 200);
  assert.equal(response.headers.get("content-type"), "text/event-stream");
  const reader = response.body!.getReader();
  let text = "";
  const read = async (until: RegExp) => {
    while (!until.test(text)) {
      const { value, done } = await reader.read();
      if (done) throw new Error(`the stream ended; it sent: ${text}`);
      text += Buffer.from(value).toString("utf8");
    }
  };
  await read(/llmgw events from id/);
  await events.record({ kind: "node_back", subject: "node:a", message: "not asked for" });
  const parked = await events.record({ kind: "model_parked", subject: "model:m", message: "parked" });
  await read(/data: .*model_parked/);
  assert.doesNotMatch(text, /node_back/);
  assert.match(text, new RegExp(`id: ${parked!.id}\\n`));
  controller.abort();

  const replay = await fetch(`${harness.url}/api/v1/events/stream`, {
    headers: { authorization: `Bearer ${harness.adminKey}`, "last-event-id": String(parked!.id - 3) },
  });
  const replayReader = replay.body!.getReader();
  let replayed = "";
  while (!/model_parked/.test(replayed)) replayed += Buffer.from((await replayReader.read()).value!).toString("utf8");
  assert.match(replayed, /job_failed[\s\S]*node_back[\s\S]*model_parked/);
  await replayReader.cancel();
  assert.equal((await fetch(`${harness.url}/api/v1/events/stream`)).status, 401, "the stream needs an admin key");
});

test("the cursor waits at a fresh gap in event ids (an insert not yet committed) and passes an old one", () => {
  const now = Date.parse("2026-12-01T10:00:10.000Z");
  const at = (seconds: number) => new Date(now - seconds * 1000).toISOString();
  // 11 is missing and 12 is a second old: 11 may still commit, so the batch stops before 12.
  assert.deepEqual(
    settled(
      [
        { id: 10, at: at(1) },
        { id: 12, at: at(1) },
        { id: 13, at: at(1) },
      ],
      9,
      now,
    ).map((e) => e.id),
    [10],
  );
  // The same gap with 12 written a minute ago: 11 failed; nothing waits for it.
  assert.deepEqual(
    settled(
      [
        { id: 10, at: at(60) },
        { id: 12, at: at(60) },
        { id: 13, at: at(1) },
      ],
      9,
      now,
    ).map((e) => e.id),
    [10, 12, 13],
  );
  // A gap right after the cursor.
  assert.deepEqual(settled([{ id: 12, at: at(1) }], 10, now), []);
});

test("on PostgreSQL: events reach a signed webhook, and a delivery pending at a stop is sent after the restart", async (t) => {
  const database = await postgresSchemaOrSkip(t);
  if (database === null) return;
  const receiver = await startReceiver();
  open.push(receiver);
  try {
    const first = await startHarness({ database, notify: RETRY_IN_A_MINUTE });
    await addWebhook(first, receiver);
    await first.server.events.record({ kind: "node_lost", subject: "node:pg-1", data: { node: "pg-1" }, message: "lost" });
    await eventually("delivered", () => receiver.webhooks().length === 1);
    receiver.answers = [500];
    await first.server.events.record({ kind: "model_parked", subject: "model:pg", data: { model: "pg" }, message: "parked" });
    await eventually("the failure is recorded", async () => failedOnce(first, "model_parked"));
    // The same data dir: its server.secret opens the channel's sealed URL and secret.
    await first.server.close();
    const second = await startHarness({ database, dataDir: first.dataDir, adminKey: first.adminKey, notify: FAST });
    open.push(second);
    await theMinutePasses(second);
    const hooks = await eventually("the parked model is delivered after the restart", () => receiver.webhooks().length === 2 && receiver.webhooks());
    assert.deepEqual(
      hooks.map((hook) => [hook.body.type, hook.verified]),
      [
        ["node_lost", true],
        ["model_parked", true],
      ],
    );
    const log = await eventually("both deliveries are recorded", async () => {
      const rows = (await second.admin("GET", "/api/v1/notify/ops/log")).body.data;
      return rows.every((row: { state: string }) => row.state === "delivered") && rows;
    });
    assert.deepEqual(
      log.map((d: { kind: string; state: string; attempts: number }) => [d.kind, d.state, d.attempts]),
      [
        ["model_parked", "delivered", 2],
        ["node_lost", "delivered", 1],
      ],
    );
    await second.close();
  } finally {
    await dropSchema(database.schema);
  }
});

test("two servers on one PostgreSQL send each event once, whichever server recorded it: the leader sends", async (t) => {
  const database = await postgresSchemaOrSkip(t);
  if (database === null) return;
  const receiver = await startReceiver();
  open.push(receiver);
  try {
    const a = await startHarness({ database, notify: FAST });
    open.push(a);
    const b = await startHarness({ database, adminKey: a.adminKey, notify: FAST });
    open.push(b);
    await addWebhook(a, receiver);
    for (let i = 0; i < 6; i++) {
      await (i % 2 === 0 ? a : b).server.events.record({ kind: "node_lost", subject: `node:n${i}`, data: { node: `n${i}` }, message: `lost ${i}` });
    }
    await eventually("all six delivered", () => receiver.webhooks().length >= 6);
    await eventually("nothing pending", async () => (await a.admin("GET", "/api/v1/notify/ops")).body.deliveries.pending === 0);
    await Promise.all([a.server.notifier.idle(), b.server.notifier.idle()]);
    const hooks = receiver.webhooks();
    assert.deepEqual(hooks.map((hook) => hook.body.data.node).sort(), ["n0", "n1", "n2", "n3", "n4", "n5"], "each event once");
    assert.ok(hooks.every((hook) => hook.verified));
    const rows = await a.server.store.db.selectFrom("notify_deliveries").select(["state"]).execute();
    assert.deepEqual(
      rows.map((row) => row.state),
      Array.from({ length: 6 }, () => "delivered"),
      "one delivery row per event",
    );
    await b.close();
    await a.close();
  } finally {
    await dropSchema(database.schema);
  }
});
