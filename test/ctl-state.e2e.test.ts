// `llmgw ctl` as a child process against a real server started with its own data dir
// (SQLite, one server, as a lone `llmgw up --data-dir DIR`): what it says about the
// server's state must match that state. The server leads, and `cluster status` says so; a
// drained node can be undrained and takes replicas again; a ctl run that looks for the admin
// key in another data dir says which one it read and how to name the server's.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { ADMIN_KEY_FILE } from "../src/core/data-dir.ts";
import { startHarness, type Harness } from "./support/server-harness.ts";

const BIN = fileURLToPath(new URL("../bin/llmgw.js", import.meta.url));
const run = promisify(execFile);

describe("ctl against a server started with its own data dir", () => {
  let harness: Harness;
  let homes: string;

  before(async () => {
    // Nodes joined by hand send no heartbeats; they must not be lost during the test.
    harness = await startHarness({ nodeTimeoutMs: 600_000 });
    // `llmgw up` / `server` keep the first admin key in the data dir (run-server.ts); the harness does not.
    writeFileSync(path.join(harness.dataDir, ADMIN_KEY_FILE), `${harness.adminKey}\n`, { mode: 0o600 });
    homes = mkdtempSync(path.join(tmpdir(), "llmgw-ctl-homes-"));
  });

  after(async () => {
    await harness.close();
    rmSync(homes, { recursive: true, force: true });
  });

  /** A fresh HOME, so ctl's default data dir (~/.llmgw) is not the server's. */
  const freshHome = (name: string): string => {
    const home = path.join(homes, name);
    mkdirSync(home, { recursive: true });
    return home;
  };

  /** ctl with only what `args` give: no LLMGW_* variables from the environment the tests run in. */
  const ctl = (args: string[], home = freshHome("default")) => {
    const env = Object.fromEntries(Object.entries(process.env).filter(([name]) => !name.startsWith("LLMGW_")));
    return run(process.execPath, [BIN, "ctl", ...args], { env: { ...env, HOME: home, LLMGW_LOG_LEVEL: "silent" } });
  };
  const ctlFails = (args: string[], home?: string) =>
    ctl(args, home).then(
      (done) => assert.fail(`ctl ${args.join(" ")} exited 0: ${done.stdout}`),
      (error: { code: number | null; stdout: string; stderr: string }) => error,
    );
  const withDataDir = (args: string[]) => ["--data-dir", harness.dataDir, ...args];

  test("cluster status on a lone server: it leads, and is listed as the leader, not as a standby", async () => {
    const view = JSON.parse((await ctl(withDataDir(["cluster", "status", "--json"]))).stdout);
    assert.deepEqual(view.leader?.name, view.self);
    assert.equal(view.leader.term, 1);
    assert.deepEqual(
      view.servers.map((server: { name: string; leader: boolean }) => [server.name, server.leader]),
      [[view.self, true]],
    );
    const { stdout } = await ctl(withDataDir(["cluster", "status"]));
    assert.match(stdout, new RegExp(`^leader: ${view.self} \\(term 1, since `));
    const row = stdout.split("\n").find((line) => line.startsWith(`${view.self} *`));
    assert.match(row ?? "", /\brunning\b.*\bleader\s*$/);
    assert.doesNotMatch(stdout, /standby|leader: none/);
  });

  test("a drained node is undrained: ready again, and the change is audited; a node not draining is refused", async () => {
    const { body } = await harness.admin("GET", "/api/v1/nodes/join-token");
    const joined = await fetch(`${harness.url}/agent/v1/join`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        join_token: body.token,
        name: "cpu-01",
        address: "127.0.0.1",
        inventory: { cores: 4, memoryBytes: 8 * 1024 ** 3, gpus: [], engines: [{ engine: "llamacpp", version: "3.21.1" }] },
      }),
    });
    assert.equal(joined.status, 201, await joined.clone().text());
    const state = async () => ((await harness.admin("GET", "/api/v1/nodes/cpu-01")).body as { state: string }).state;

    const drained = await ctl(withDataDir(["node", "drain", "cpu-01"]));
    assert.equal(
      drained.stdout,
      "Node 'cpu-01' is draining: nothing new is placed there, and it runs no replicas. 'llmgw ctl node undrain cpu-01' ends the drain.\n",
    );
    assert.equal(await state(), "draining");

    const undrained = await ctl(withDataDir(["node", "undrain", "cpu-01"]));
    assert.equal(undrained.stdout, "Node 'cpu-01' is ready: new replicas may be placed there again.\n");
    assert.equal(await state(), "ready");
    const audit = (await harness.admin("GET", "/api/v1/audit?action=node.undrain")).body;
    assert.equal(audit?.data?.[0]?.target, "cpu-01", JSON.stringify(audit));

    // Undrained already: nothing to undrain, so a 409 that says so, no audit entry, and ctl fails with it.
    const again = await harness.admin("POST", "/api/v1/nodes/cpu-01/undrain");
    assert.equal(again.status, 409, JSON.stringify(again.body));
    assert.equal(again.body?.error?.code, "node_not_draining");
    const notDraining = await ctlFails(withDataDir(["node", "undrain", "cpu-01"]));
    assert.equal(notDraining.code, 1);
    assert.equal(notDraining.stdout, "");
    assert.match(notDraining.stderr, /Node 'cpu-01' is not draining \(it is ready\); there is nothing to undrain\./);
    assert.equal(await state(), "ready");
    const auditAfter = (await harness.admin("GET", "/api/v1/audit?action=node.undrain")).body;
    assert.equal(auditAfter?.data?.length, audit?.data?.length, `a refused undrain is not audited: ${JSON.stringify(auditAfter)}`);

    const unknown = await ctlFails(withDataDir(["node", "undrain", "cpu-99"]));
    assert.equal(unknown.code, 1);
    assert.match(unknown.stderr, /cpu-99/);
  });

  test("without --data-dir or LLMGW_DATA_DIR, the missing admin key names the data dir it looked in and both ways to give the server's", async () => {
    const home = freshHome("no-key");
    const failed = await ctlFails(["model", "list"], home);
    assert.equal(failed.code, 1);
    assert.match(failed.stderr, new RegExp(`no ${path.join(home, ".llmgw", ADMIN_KEY_FILE).replace(/[.]/g, "\\.")}`));
    for (const named of ["--data-dir", "LLMGW_DATA_DIR", "--key", "LLMGW_KEY"])
      assert.ok(failed.stderr.includes(named), `the error names ${named}: ${failed.stderr}`);
    // As the error says: the server's data dir finds its address and key.
    const { stdout } = await ctl(withDataDir(["model", "list"]), home);
    assert.doesNotMatch(stdout, /error/i);
  });

  test("an admin key from another data dir that the server refuses: the error names the file it came from and --data-dir", async () => {
    const home = freshHome("other-key");
    // Another `llmgw up` on this machine left its own key in the default data dir.
    mkdirSync(path.join(home, ".llmgw"));
    writeFileSync(path.join(home, ".llmgw", ADMIN_KEY_FILE), "sk-admin-of-another-server-0123456789\n", { mode: 0o600 });
    const failed = await ctlFails(["--server", harness.url, "model", "list"], home);
    assert.equal(failed.code, 1);
    assert.ok(failed.stderr.includes(`ctl read the admin key from ${path.join(home, ".llmgw", ADMIN_KEY_FILE)}`), failed.stderr);
    for (const named of ["--data-dir", "LLMGW_DATA_DIR", "--key", "LLMGW_KEY"])
      assert.ok(failed.stderr.includes(named), `the error names ${named}: ${failed.stderr}`);
  });
});
