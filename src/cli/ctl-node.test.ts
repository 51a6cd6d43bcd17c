// What `ctl node drain` and `undrain` say: the replica count and its verb agree (one
// replica stops, two stop), a node without replicas says so, and an undrained node that is
// lost says when it takes replicas again. And `ctl node update NAME --address HOST` as a
// child process against a real server: the address changes (kept in its canonical form) and
// is audited, and an address with a port, a scheme, an IPv6 zone id or an IPv4 address in
// another form than dotted decimal is refused before anything is sent (and by the server too).
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { startHarness, type Harness } from "../../test/support/server-harness.ts";
import { describeAddressUpdate, describeDrain, describeUndrain, type NodeView } from "./ctl-node.ts";

const BIN = fileURLToPath(new URL("../../bin/llmgw.js", import.meta.url));
const run = promisify(execFile);

const replica = (id: string): NodeView["replicas"][number] => ({ id, model: "tiny", state: "ready", profile: "cpu" });

test("drain: the count of replicas and the verb agree", () => {
  assert.match(
    describeDrain({ name: "gpu-01", replicas: [replica("r-1")] }),
    /^Node 'gpu-01' is draining: nothing new is placed there, and its 1 replica stops once replaced elsewhere \(it keeps running if there is no room elsewhere\)\./,
  );
  assert.match(
    describeDrain({ name: "gpu-01", replicas: [replica("r-1"), replica("r-2")] }),
    /and its 2 replicas stop once replaced elsewhere \(those without room elsewhere keep running\)\./,
  );
  assert.match(describeDrain({ name: "gpu-01", replicas: [] }), /^Node 'gpu-01' is draining: nothing new is placed there, and it runs no replicas\./);
  assert.match(describeDrain({ name: "gpu-01", replicas: [] }), /'llmgw ctl node undrain gpu-01' ends the drain\.$/);
});

test("undrain: ready again, or lost until its agent is back", () => {
  assert.equal(describeUndrain({ name: "gpu-01", state: "ready" }), "Node 'gpu-01' is ready: new replicas may be placed there again.");
  assert.match(describeUndrain({ name: "gpu-01", state: "lost" }), /no longer draining; it is lost now and takes new replicas once its agent is back/);
});

test("update: the new address, the old one, and what the agent must do; nothing changed says so", () => {
  assert.equal(
    describeAddressUpdate({ name: "gpu-01", address: "10.0.0.8", previous_address: "10.0.0.7" }),
    "Node 'gpu-01' now has address 10.0.0.8 (was 10.0.0.7). Its agent must report that address (--advertise 10.0.0.8); its replicas are routed to again once it reports them running there.",
  );
  assert.equal(
    describeAddressUpdate({ name: "gpu-01", address: "10.0.0.8", previous_address: "10.0.0.8" }),
    "Node 'gpu-01' already has address 10.0.0.8; nothing changed.",
  );
});

describe("ctl node update against a server", () => {
  let harness: Harness;
  const ctl = (...args: string[]) =>
    run(process.execPath, [BIN, "ctl", "--server", harness.url, "--key", harness.adminKey, "node", ...args], {
      env: { ...process.env, LLMGW_LOG_LEVEL: "silent" },
    });
  const inventory = { cores: 4, memoryBytes: 8 * 1024 ** 3, gpus: [], engines: [{ engine: "llamacpp" as const, version: "3.21.1" }] };

  before(async () => {
    harness = await startHarness();
    await harness.server.fleet.join({ joinToken: harness.server.joinToken(), name: "far-01", address: "10.0.0.7", inventory, labels: {} });
  });
  after(async () => {
    await harness.close();
  });

  test("moves the node to the new address, audited; a port or scheme is refused with the flag named, before anything is sent", async () => {
    const moved = await ctl("update", "far-01", "--address", "10.0.0.8");
    assert.match(moved.stdout, /^Node 'far-01' now has address 10\.0\.0\.8 \(was 10\.0\.0\.7\)\./);
    const shown = (await harness.admin("GET", "/api/v1/nodes/far-01")).body as NodeView;
    assert.equal(shown.address, "10.0.0.8");
    const audit = (await harness.admin("GET", "/api/v1/audit")).body.data as Array<{ action: string; target: string; detail: unknown }>;
    const entries = audit.filter((entry) => entry.action === "node.update");
    assert.deepEqual(
      entries.map((entry) => [entry.target, entry.detail]),
      [["far-01", { address: "10.0.0.8", previous_address: "10.0.0.7" }]],
    );

    for (const [bad, why] of [
      ["10.0.0.9:8080", /Invalid --address: '10\.0\.0\.9:8080' has a port/],
      ["http://10.0.0.9", /Invalid --address: 'http:\/\/10\.0\.0\.9' has a scheme/],
      ["fe80::1%eth0", /Invalid --address: 'fe80::1%eth0' has a zone id \(%eth0\)/],
      ["0x7f.1", /Invalid --address: '0x7f\.1' is read as the IPv4 address 127\.0\.0\.1: give it in dotted-decimal form/],
    ] as const) {
      const refused = await ctl("update", "far-01", "--address", bad).then(
        () => assert.fail(`--address ${bad} was accepted`),
        (error: { code: number; stderr: string }) => error,
      );
      assert.notEqual(refused.code, 0);
      assert.match(refused.stderr, why);
    }
    // Kept in its canonical form: lower-case, without the trailing dot.
    const json = await ctl("update", "far-01", "--address", "GPU-Far.Example.COM.", "--json");
    assert.equal(JSON.parse(json.stdout).address, "gpu-far.example.com");
    // The server checks the same (for other clients of the API), and names the field.
    const direct = await harness.admin("PATCH", "/api/v1/nodes/far-01", { address: "10.0.0.9:8080" });
    assert.equal(direct.status, 400);
    assert.equal(direct.body.error.param, "address");
    assert.match(direct.body.error.message, /has a port/);
    for (const [bad, why] of [
      ["fe80::1%eth0", /has a zone id/],
      ["0x0a000005", /is read as the IPv4 address 10\.0\.0\.5: give it in dotted-decimal form/],
    ] as const) {
      const refused = await harness.admin("PATCH", "/api/v1/nodes/far-01", { address: bad });
      assert.equal(refused.status, 400, bad);
      assert.equal(refused.body.error.param, "address");
      assert.match(refused.body.error.message, why);
    }
    assert.equal((await harness.admin("PATCH", "/api/v1/nodes/nope", { address: "10.0.0.9" })).status, 404);
    assert.equal(((await harness.admin("GET", "/api/v1/nodes/far-01")).body as NodeView).address, "gpu-far.example.com");
  });
});
