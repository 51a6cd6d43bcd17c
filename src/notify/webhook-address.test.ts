// Where notifications may go: the ranges counted as private (literal addresses, IPv4-mapped
// and other IPv6 forms of them), the refusal of such receivers and of URLs with a user
// part when a channel is added (a real server, SQLite), the flag that allows them, and the
// check at connect time, on the address actually connected to: a name that resolved to a
// public address when the channel was added and to a private one at send time (DNS
// rebinding, played by an injected resolver) is never connected to.
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { startHarness, type Harness } from "../../test/support/server-harness.ts";
import { startReceiver, type Receiver } from "../../test/support/webhook-receiver.ts";
import { sendNotification } from "./sender.ts";
import type { NotifyEvent } from "./messages.ts";
import { privateRangeOf, webhookAgent, type ResolveHost } from "./webhook-address.ts";

const open: Array<{ close(): Promise<void> }> = [];
after(async () => {
  for (const item of open.reverse()) await item.close().catch(() => undefined);
});

async function receiverAndHarness(allowPrivateWebhooks: boolean): Promise<{ harness: Harness; receiver: Receiver }> {
  const receiver = await startReceiver();
  const harness = await startHarness({ allowPrivateWebhooks, notify: { notify: { backoffMs: 50, maxBackoffMs: 100, pollMs: 50 } } });
  open.push(receiver, harness);
  return { harness, receiver };
}

test("private, loopback, link-local and reserved addresses are told apart from public ones, in every IPv6 form of an IPv4 one", () => {
  const privateOnes: Array<[string, RegExp]> = [
    ["169.254.169.254", /^169\.254\.0\.0\/16, link-local/],
    ["10.0.0.1", /^10\.0\.0\.0\/8, a private network/],
    ["172.16.5.4", /^172\.16\.0\.0\/12/],
    ["172.31.255.255", /^172\.16\.0\.0\/12/],
    ["192.168.1.1", /^192\.168\.0\.0\/16/],
    ["127.0.0.1", /^127\.0\.0\.0\/8, loopback/],
    ["127.255.0.9", /^127\.0\.0\.0\/8/],
    ["0.0.0.0", /^0\.0\.0\.0\/8/],
    ["100.64.0.1", /^100\.64\.0\.0\/10, shared address space/],
    ["100.100.100.200", /^100\.64\.0\.0\/10/],
    ["224.0.0.1", /multicast/],
    ["255.255.255.255", /^240\.0\.0\.0\/4/],
    ["::1", /^::1\/128, loopback/],
    ["[::1]", /^::1\/128/],
    ["::", /^::\/128/],
    ["fe80::1", /^fe80::\/10, link-local/],
    ["fc00::1", /^fc00::\/7/],
    ["fd12:3456::1", /^fc00::\/7/],
    ["::ffff:10.0.0.1", /IPv4-mapped IPv6\) of 10\.0\.0\.1, in 10\.0\.0\.0\/8/],
    // The form a URL's parser turns [::ffff:10.0.0.1] into.
    ["::ffff:a00:1", /of 10\.0\.0\.1, in 10\.0\.0\.0\/8/],
    ["::ffff:169.254.169.254", /of 169\.254\.169\.254, in 169\.254\.0\.0\/16/],
    ["64:ff9b::a9fe:a9fe", /NAT64\) of 169\.254\.169\.254/],
    ["2002:c0a8:101::1", /6to4\) of 192\.168\.1\.1/],
    ["::7f00:1", /IPv4-compatible/],
  ];
  for (const [address, range] of privateOnes) assert.match(privateRangeOf(address) ?? "public", range, address);
  for (const address of ["8.8.8.8", "172.32.0.1", "100.128.0.1", "169.255.0.1", "2606:4700:4700::1111", "::ffff:8.8.8.8", "2002:808:808::1", "example.com"])
    assert.equal(privateRangeOf(address), null, address);
});

test("a channel to a private address is refused when it is added, naming the address, its range and the flag", async () => {
  const { harness, receiver } = await receiverAndHarness(false);
  const port = new URL(receiver.url).port;
  const cases: Array<[Record<string, string>, RegExp]> = [
    [{ webhook: "http://169.254.169.254/latest/meta-data/iam" }, /address 169\.254\.169\.254 is in 169\.254\.0\.0\/16, link-local/],
    [{ webhook: "http://[::ffff:10.0.0.1]/hooks" }, /10\.0\.0\.1, in 10\.0\.0\.0\/8/],
    [{ webhook: `http://[::1]:${port}/hooks/llmgw` }, /address ::1 is in ::1\/128, loopback/],
    [{ webhook: receiver.url }, /address 127\.0\.0\.1 is in 127\.0\.0\.0\/8, loopback/],
    [{ webhook: "https://172.20.1.1/x" }, /172\.16\.0\.0\/12/],
    [{ webhook: "https://100.64.3.4/x" }, /100\.64\.0\.0\/10/],
    [{ webhook: "http://0.0.0.0:8080/x" }, /0\.0\.0\.0\/8/],
    [{ webhook: "http://[fe80::1]/x" }, /fe80::\/10/],
    [{ webhook: "http://[fd00::5]/x" }, /fc00::\/7/],
    // The URL parser reads these as 127.0.0.1: the check is on what is connected to, not on how it was written.
    [{ webhook: "http://2130706433/x" }, /127\.0\.0\.1 is in 127\.0\.0\.0\/8/],
    [{ slack: "https://192.168.1.10/services/T/B/x" }, /192\.168\.0\.0\/16/],
    // A name is resolved when it is given: localhost is loopback.
    [{ webhook: `http://localhost:${port}/hooks/llmgw` }, /address 127\.0\.0\.1 \(what 'localhost' resolves to\) is in 127\.0\.0\.0\/8/],
  ];
  for (const [target, message] of cases) {
    const answer = await harness.admin("POST", "/api/v1/notify", { name: "ops", ...target });
    assert.equal(answer.status, 400, JSON.stringify(target));
    assert.equal(answer.body.error.code, "webhook_private_address");
    assert.equal(answer.body.error.param, Object.keys(target)[0]);
    assert.match(answer.body.error.message, message);
    assert.match(answer.body.error.message, /--allow-private-webhooks \(or LLMGW_ALLOW_PRIVATE_WEBHOOKS=1\)/);
  }
  assert.equal((await harness.admin("GET", "/api/v1/notify")).body.data.length, 0, "nothing was added");
  // A public receiver's name that does not resolve from here is accepted: each connection is checked anyway.
  assert.equal((await harness.admin("POST", "/api/v1/notify", { name: "team", slack: "https://hooks.slack.invalid/services/T/B/x" })).status, 201);
});

test("with --allow-private-webhooks a loopback receiver is added by name and by address, and gets its notifications", async () => {
  const { harness, receiver } = await receiverAndHarness(true);
  const byName = await harness.admin("POST", "/api/v1/notify", { name: "ops", webhook: receiver.url.replace("127.0.0.1", "localhost") });
  assert.equal(byName.status, 201, JSON.stringify(byName.body));
  receiver.secret = byName.body.secret;
  assert.equal((await harness.admin("POST", "/api/v1/notify", { name: "metadata", webhook: "http://169.254.169.254/hook" })).status, 201);
  const sent = await harness.admin("POST", "/api/v1/notify/ops/test");
  assert.equal(sent.body.delivery.state, "delivered", JSON.stringify(sent.body));
  assert.equal(receiver.webhooks()[0]!.verified, true);
});

test("a URL with a user name or password is refused, saying where credentials go instead", async () => {
  const { harness } = await receiverAndHarness(true);
  const webhook = await harness.admin("POST", "/api/v1/notify", { name: "ops", webhook: "https://bob:hunter2@hooks.example.com/llmgw" });
  assert.equal(webhook.status, 400);
  assert.equal(webhook.body.error.code, "webhook_url_userinfo");
  assert.equal(webhook.body.error.param, "webhook");
  assert.match(webhook.body.error.message, /user name or password in it .* which llmgw does not send; remove it: .*signing secret \('secret', or --secret\)/);
  assert.ok(!JSON.stringify(webhook.body).includes("hunter2"), "the password is not repeated back");
  const userOnly = await harness.admin("POST", "/api/v1/notify", { name: "ops", webhook: "https://token@hooks.example.com/llmgw" });
  assert.equal(userOnly.body.error.code, "webhook_url_userinfo");
  const slack = await harness.admin("POST", "/api/v1/notify", { name: "team", slack: "https://u:p@hooks.slack.com/services/T/B/x" });
  assert.equal(slack.body.error.code, "webhook_url_userinfo");
  assert.match(slack.body.error.message, /carries its credential in its path/);
});

const EVENT: NotifyEvent = { id: 1, at: new Date().toISOString(), kind: "node_lost", severity: "warning", subject: "node:n1", message: "lost", data: {} };
const SEND = { messageId: "msg_1", timeoutMs: 10_000, consoleUrl: "http://console", now: Date.now };

test("at send time, a name that now resolves to a private address is not connected to; the attempt fails saying why", async () => {
  const receiver = await startReceiver();
  open.push(receiver);
  const { port } = new URL(receiver.url);
  // A public address when the channel was added; loopback now, where the receiver listens.
  const rebound: ResolveHost = async () => [{ address: "127.0.0.1", family: 4 }];
  const url = `http://rebound.example:${port}/hooks/llmgw`;

  const guarded = webhookAgent({ allowPrivate: false, resolve: rebound });
  open.push(guarded);
  const refused = await sendNotification({ kind: "webhook", url, key: null }, EVENT, { ...SEND, dispatcher: guarded });
  assert.equal(refused.result, "retry");
  assert.equal(refused.status, null);
  assert.match(
    refused.error ?? "",
    /refused to connect to 127\.0\.0\.1 \(what 'rebound\.example' resolves to now\): it is in 127\.0\.0\.0\/8, loopback .*--allow-private-webhooks/,
  );
  // A literal address is never looked up: it is checked before connecting.
  const literal = await sendNotification({ kind: "slack", url: receiver.url, key: null }, EVENT, { ...SEND, dispatcher: guarded });
  assert.match(literal.error ?? "", /refused to connect to 127\.0\.0\.1: it is in 127\.0\.0\.0\/8/);
  const literalV6 = await sendNotification({ kind: "webhook", url: `http://[::ffff:7f00:1]:${port}/hooks/llmgw`, key: null }, EVENT, {
    ...SEND,
    dispatcher: guarded,
  });
  assert.match(literalV6.error ?? "", /refused to connect to ::ffff:7f00:1: .*of 127\.0\.0\.1/);
  assert.equal(receiver.requests.length, 0, "nothing reached the receiver");

  // The same resolver with private receivers allowed: the name does reach the receiver, so
  // the refusals above were the guard's, not an unreachable name's.
  const allowed = webhookAgent({ allowPrivate: true, resolve: rebound });
  open.push(allowed);
  const delivered = await sendNotification({ kind: "webhook", url, key: null }, EVENT, { ...SEND, dispatcher: allowed });
  assert.equal(delivered.result, "delivered", delivered.error ?? "");
  assert.equal(receiver.requests.length, 1);
});

test("a channel added while private receivers were allowed is refused at connect once they are not; the delivery row says why", async () => {
  const receiver = await startReceiver();
  open.push(receiver);
  const first = await startHarness({ allowPrivateWebhooks: true });
  const created = await first.admin("POST", "/api/v1/notify", { name: "ops", webhook: receiver.url });
  assert.equal(created.status, 201);
  await first.server.close();
  const second = await startHarness({ dataDir: first.dataDir, adminKey: first.adminKey, allowPrivateWebhooks: false });
  open.push(second);
  const sent = await second.admin("POST", "/api/v1/notify/ops/test");
  assert.equal(sent.status, 200);
  assert.equal(sent.body.delivery.state, "failed");
  assert.match(sent.body.delivery.last_error, /refused to connect to 127\.0\.0\.1: it is in 127\.0\.0\.0\/8, loopback .*--allow-private-webhooks/);
  const log = (await second.admin("GET", "/api/v1/notify/ops/log")).body.data;
  assert.match(log[0].last_error, /refused to connect to 127\.0\.0\.1/);
  assert.equal(receiver.requests.length, 0);
});
