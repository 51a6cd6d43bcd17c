// `llmgw ctl notify ...` and `llmgw ctl events` as child processes against a real server:
// add prints a webhook's secret once, list and log never show it, test says how the
// receiver answered (and exits 1 when it was not delivered), enable follows a 410, and
// events lists what happened.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { startHarness, type Harness } from "../../test/support/server-harness.ts";
import { startReceiver, type Receiver } from "../../test/support/webhook-receiver.ts";
import { eventually } from "../../test/support/eventually.ts";

const BIN = fileURLToPath(new URL("../../bin/llmgw.js", import.meta.url));
const run = promisify(execFile);

describe("ctl notify against a server", () => {
  let harness: Harness;
  let receiver: Receiver;
  const ctl = (...args: string[]) =>
    run(process.execPath, [BIN, "ctl", "--server", harness.url, "--key", harness.adminKey, ...args], { env: { ...process.env, LLMGW_LOG_LEVEL: "silent" } });

  before(async () => {
    harness = await startHarness({ notify: { notify: { backoffMs: 50, maxBackoffMs: 100, pollMs: 50 } } });
    receiver = await startReceiver();
  });
  after(async () => {
    await harness.close();
    await receiver.close();
  });

  test("add, list, test, log, update, enable, rm", async () => {
    const added = await ctl(
      "notify",
      "add",
      "ops",
      "--webhook",
      `${receiver.url}?token=abc123`,
      "--events",
      "model_parked,node_lost,job_failed",
      "--min-severity",
      "warning",
    );
    const secret = /^(whsec_\S+)$/m.exec(added.stdout)?.[1];
    assert.ok(secret, `the secret is printed: ${added.stdout}`);
    assert.match(added.stdout, /shown this once/);
    receiver.secret = secret!;

    const listed = await ctl("notify", "list");
    assert.match(listed.stdout, /ops\s+webhook\s+http:\/\/127\.0\.0\.1:\d+\/hooks\/…\?…\s+model_parked,node_lost,job_failed\s+warning\s+enabled/);
    assert.ok(!listed.stdout.includes(secret!) && !listed.stdout.includes("abc123"));

    const tested = await ctl("notify", "test", "ops");
    assert.match(tested.stdout, /Delivered: the receiver of 'ops' answered 200/);
    assert.equal(receiver.webhooks()[0]!.verified, true);

    receiver.answers = [500];
    const failed = await ctl("notify", "test", "ops").then(
      () => assert.fail("a test that was not delivered exits non-zero"),
      (error: { code: number; stdout: string }) => error,
    );
    assert.equal(failed.code, 1);
    assert.match(failed.stdout, /Not delivered to 'ops': the receiver answered 500/);

    // Without a name: every channel, each with its own line.
    assert.equal((await harness.admin("POST", "/api/v1/notify", { name: "second", webhook: receiver.url, secret: receiver.secret })).status, 201);
    const all = await ctl("notify", "test");
    assert.match(all.stdout, /^Delivered: the receiver of 'ops' answered 200\.\nDelivered: the receiver of 'second' answered 200\.$/m);
    await ctl("notify", "rm", "second");

    const log = await ctl("notify", "log", "ops");
    assert.match(log.stdout, /notify_test\s+channel:ops\s+failed\s+1\s+500/);
    assert.match(log.stdout, /notify_test\s+channel:ops\s+delivered\s+1\s+200/);

    const updated = await ctl("notify", "update", "ops", "--events", "all");
    assert.match(updated.stdout, /events: all, from warning; enabled/);

    receiver.answers = [410];
    await harness.server.events.record({ kind: "node_lost", subject: "node:n1", message: "Node 'n1' sent no heartbeat." });
    await eventually("the channel is disabled", async () => /disabled/.test((await ctl("notify", "list")).stdout));
    const enabled = await ctl("notify", "enable", "ops");
    assert.match(enabled.stdout, /enabled again/);

    const events = await ctl("events", "--kind", "node_lost", "--since", "1h");
    assert.match(events.stdout, /WARNING\s+node_lost\s+node:n1\s+Node 'n1' sent no heartbeat\./);
    const json = JSON.parse((await ctl("events", "--json")).stdout);
    assert.equal(json[0].kind, "node_lost");

    assert.match((await ctl("notify", "rm", "ops")).stdout, /Removed channel 'ops'/);
    assert.match((await ctl("notify", "list")).stdout, /^NAME/);
  });

  test("events --follow prints new events of the kinds asked for as they happen", async () => {
    const child = spawn(
      process.execPath,
      [BIN, "ctl", "--server", harness.url, "--key", harness.adminKey, "events", "--follow", "--json", "--kind", "model_parked"],
      { env: { ...process.env, LLMGW_LOG_LEVEL: "silent" } },
    );
    let out = "";
    child.stdout.on("data", (chunk: Buffer) => (out += chunk.toString("utf8")));
    try {
      // Recorded until the follower prints one: the first may come before the stream is open.
      await eventually("a followed event is printed", async () => {
        if (!out.includes('"subject":"model:first"'))
          await harness.server.events.record({ kind: "model_parked", subject: "model:first", message: "parked ünïcode" });
        return out.includes('"subject":"model:first"');
      });
      const line = JSON.parse(out.trim().split("\n")[0]!);
      assert.equal(line.kind, "model_parked");
      assert.equal(line.message, "parked ünïcode");
      await harness.server.events.record({ kind: "node_lost", subject: "node:ignored", message: "not a kind followed" });
      await harness.server.events.record({ kind: "model_parked", subject: "model:second", message: "parked" });
      await eventually("the second is printed", () => out.includes('"subject":"model:second"'));
      assert.ok(!out.includes("node:ignored"));
    } finally {
      child.kill();
    }
  });

  test("bad flags are refused naming what is wrong", async () => {
    const refused = async (args: string[], message: RegExp) => {
      const error = await ctl(...args).then(
        () => assert.fail(`'${args.join(" ")}' should fail`),
        (failure: { stderr: string }) => failure,
      );
      assert.match(error.stderr, message);
    };
    await refused(["notify", "add", "x"], /Give exactly one of --webhook URL or --slack URL/);
    await refused(["notify", "add", "x", "--webhook", receiver.url, "--events", "model_parked,meteor_strike"], /'meteor_strike' is not an event kind/);
    await refused(["notify", "update", "x"], /Nothing to update/);
    await refused(["notify", "test", "nobody"], /no notification channel named 'nobody'/);
    await refused(["events", "--since", "last tuesday"], /span back from now/);
    await refused(["events", "--follow", "--since", "1h"], /--follow prints events from now on/);
    await refused(["events", "--follow", "--kind", "nonsense"], /'nonsense' is not an event kind/);
  });
});

describe("ctl notify against a server that keeps notifications off private networks", () => {
  let harness: Harness;
  before(async () => {
    harness = await startHarness({ allowPrivateWebhooks: false });
  });
  after(async () => {
    await harness.close();
  });

  test("add refuses a private or link-local receiver, and one with a password in its URL, saying what to do", async () => {
    const add = (...args: string[]) =>
      run(process.execPath, [BIN, "ctl", "--server", harness.url, "--key", harness.adminKey, "notify", "add", ...args], {
        env: { ...process.env, LLMGW_LOG_LEVEL: "silent" },
      }).then(
        () => assert.fail(`'notify add ${args.join(" ")}' should fail`),
        (failure: { code: number; stderr: string }) => failure,
      );
    const metadata = await add("ops", "--webhook", "http://169.254.169.254/latest/meta-data");
    assert.equal(metadata.code, 1);
    assert.match(metadata.stderr, /169\.254\.169\.254 is in 169\.254\.0\.0\/16, link-local .*--allow-private-webhooks/);
    assert.match((await add("team", "--slack", "http://localhost:9/services/x")).stderr, /'localhost' resolves to\) is in 127\.0\.0\.0\/8/);
    assert.match((await add("ops", "--webhook", "https://bob:pw@hooks.example.com/x")).stderr, /user name or password .*signing secret/);
  });
});
