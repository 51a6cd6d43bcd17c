// The server as a whole, in this process: one server per data dir, server.json owned by
// the server that wrote it, and storage faults (a full disk, a read-only data dir) named
// to admins, said by /readyz and survived by the gateway, until writes work again.
import { test, type TestContext } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import net from "node:net";
import path from "node:path";
import { silentLogger } from "../core/log.ts";
import { ConflictError } from "../core/errors.ts";
import { startServer } from "./server.ts";
import { startHarness, type Harness } from "../../test/support/server-harness.ts";
import { startFakeUpstream } from "../../test/support/fake-upstream.ts";
import { mountSmallDisk } from "../../test/support/small-disk.ts";
import { eventually } from "../../test/support/eventually.ts";

test("a second server on a data dir in use is refused, naming the first; the first keeps its server.json and runs on", async () => {
  const harness = await startHarness();
  try {
    const info = readFileSync(path.join(harness.dataDir, "server.json"), "utf8");
    const second = startServer({
      dataDir: harness.dataDir,
      host: "127.0.0.1",
      port: 0,
      database: path.join(harness.dataDir, "llmgw.db"),
      logger: silentLogger(),
    });
    await assert.rejects(
      second,
      (error: unknown) =>
        error instanceof ConflictError &&
        error.code === "data_dir_in_use" &&
        error.message.includes(`(PID ${process.pid}, listening on ${harness.url}, since `),
    );
    assert.equal(readFileSync(path.join(harness.dataDir, "server.json"), "utf8"), info);
    assert.equal((await fetch(`${harness.url}/healthz`)).status, 200);
  } finally {
    await harness.close();
  }
});

test("a health check in HTTP/1.0 without a Host header (a plain load balancer check) gets /readyz and /healthz", async () => {
  const harness = await startHarness();
  try {
    const port = new URL(harness.url).port;
    for (const pathname of ["/readyz", "/healthz"]) {
      const answer = await new Promise<string>((resolve, reject) => {
        const socket = net.connect(Number(port), "127.0.0.1", () => socket.write(`GET ${pathname} HTTP/1.0\r\n\r\n`));
        let text = "";
        socket.on("data", (chunk) => (text += chunk.toString()));
        socket.on("end", () => resolve(text));
        socket.on("error", reject);
      });
      assert.match(answer, /^HTTP\/1\.1 200 OK\r\n/, `${pathname}: ${answer.slice(0, 200)}`);
      assert.match(answer, /"status":"(ready|ok)"/);
    }
  } finally {
    await harness.close();
  }
});

test("server.json is removed on stop only by the server that wrote it", async () => {
  const first = await startHarness();
  const infoFile = path.join(first.dataDir, "server.json");
  await first.server.close();
  assert.equal(existsSync(infoFile), false, "a clean stop removes its own server.json");
  assert.equal(existsSync(path.join(first.dataDir, "server.lock")), false, "and its lock");
  await first.close();

  const second = await startHarness();
  const secondInfo = path.join(second.dataDir, "server.json");
  const foreign = JSON.stringify({ url: "http://127.0.0.1:9", pid: 1, instance: "another-server" });
  writeFileSync(secondInfo, foreign);
  await second.server.close();
  assert.equal(readFileSync(secondInfo, "utf8"), foreign, "another server's server.json stays");
  await second.close();
});

interface Fault {
  /** What the message says the cause is. */
  cause: RegExp;
  inject(harness: Harness): void;
  repair(harness: Harness): void;
}

async function storageFaultScenario(t: TestContext, fault: Fault, dataDir?: string): Promise<void> {
  const upstream = await startFakeUpstream({ reply: "still answering" });
  const harness = await startHarness(dataDir === undefined ? {} : { dataDir });
  try {
    assert.equal(
      (await harness.admin("POST", "/api/v1/models", { name: "ext", profiles: [{ name: "p", engine: "external", url: upstream.url }] })).status,
      201,
    );
    const clientKey = await harness.clientKey();
    const ready = await fetch(`${harness.url}/readyz`);
    assert.deepEqual(await ready.json(), { status: "ready", usage_rows_dropped: 0 });

    fault.inject(harness);
    const refused = await harness.admin("POST", "/api/v1/keys", { name: "during-the-fault" });
    assert.equal(refused.status, 503, JSON.stringify(refused.body));
    assert.equal(refused.body.error.code, "storage_unavailable");
    assert.ok(refused.body.error.message.includes(`the data dir ${harness.dataDir}`), refused.body.error.message);
    assert.match(refused.body.error.message, fault.cause);
    assert.doesNotMatch(refused.body.error.message, /rollback/);
    const model = await harness.admin("POST", "/api/v1/models", { name: "during", profiles: [{ name: "p", engine: "external", url: upstream.url }] });
    assert.equal(model.status, 503, JSON.stringify(model.body));
    assert.equal(model.body.error.code, "storage_unavailable");

    const notReady = await fetch(`${harness.url}/readyz`);
    assert.equal(notReady.status, 503);
    const readiness = (await notReady.json()) as { status: string; reason: string };
    assert.equal(readiness.status, "not_ready");
    assert.match(readiness.reason, fault.cause);

    // The gateway answers on; the usage rows it cannot store wait in the spool (memory first).
    const usageRows = async () =>
      Number(
        (
          await harness.server.store.db
            .selectFrom("usage")
            .select((eb) => eb.fn.countAll().as("n"))
            .executeTakeFirstOrThrow()
        ).n,
      );
    const rowsBefore = await usageRows();
    for (let i = 0; i < 3; i += 1) {
      const answer = await fetch(`${harness.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${clientKey}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "ext", messages: [{ role: "user", content: "hi" }] }),
      });
      assert.equal(answer.status, 200);
      const completion = (await answer.json()) as { choices: Array<{ message: { content: string } }> };
      assert.match(completion.choices[0]?.message.content ?? "", /still answering/);
    }
    const spooled = await eventually("the refused usage rows to be spooled", async () => {
      const metrics = await (await fetch(`${harness.url}/metrics`, { headers: { authorization: `Bearer ${harness.adminKey}` } })).text();
      const value = Number(/^llmgw_usage_rows_spooled (\d+)/m.exec(metrics)?.[1] ?? 0);
      return value >= 3 && value;
    });
    t.diagnostic(`${spooled} usage rows spooled`);

    fault.repair(harness);
    await eventually("/readyz to recover", async () => (await fetch(`${harness.url}/readyz`)).status === 200);
    // Nothing was lost: the spooled rows reach the store once it takes writes again.
    await eventually("the spooled usage rows in the store", async () => (await usageRows()) >= rowsBefore + 3);
    assert.equal(((await (await fetch(`${harness.url}/readyz`)).json()) as { usage_rows_dropped: number }).usage_rows_dropped, 0);
    assert.equal((await harness.admin("POST", "/api/v1/keys", { name: "after-the-fault" })).status, 201);
  } finally {
    await harness.close();
    await upstream.close();
  }
}

// query_only makes the real SQLite file refuse every write with SQLITE_READONLY, as a
// read-only data dir does (a read-only remount is refused while the database is open).
const readOnly: Fault = {
  cause: /read-only .*\(SQLITE_READONLY\)/,
  inject: (harness) => harness.server.store.sqlite!.pragma("query_only = 1"),
  repair: (harness) => harness.server.store.sqlite!.pragma("query_only = 0"),
};

test("a full disk: admin writes get 503 storage_unavailable naming the data dir, /readyz says why, the gateway answers on, and freeing space recovers", async (t) => {
  const disk = mountSmallDisk(16);
  if ("problem" in disk) {
    // Reported as a skip, not passed on another fault's strength: the read-only data dir
    // has its own test below. Mounting needs root (CI runs as root in a container).
    t.skip(`a full disk needs a small file system of its own, and ${disk.problem}; run as root (in a container, with CAP_SYS_ADMIN) to mount one`);
    return;
  }
  try {
    await storageFaultScenario(
      t,
      { cause: /the disk is full \(SQLITE_FULL\)/, inject: () => disk.fill(), repair: () => disk.free() },
      path.join(disk.root, "data"),
    );
  } finally {
    disk.unmount();
  }
});

test("a read-only data dir: the same, and writes work again once it is writable", async (t) => {
  await storageFaultScenario(t, readOnly);
});
