// The engine build's lock: created whole, one holder at a time; a live builder is waited
// for with a line every so often; a gone one's lock (dead, reused pid, earlier boot, a bare
// pid of an older llmgw, an unreadable lock past its grace) is taken over by exactly one of
// several racers; a lock from another host is refused; a release removes only its own lock.
import assert from "node:assert/strict";
import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, readdirSync, rmSync, utimesSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, test } from "node:test";
import { fileURLToPath } from "node:url";
import { eventually } from "../../../test/support/eventually.ts";
import { type Builder, LOCK_FILE, takeBuildLock } from "./build-lock.ts";
import { readProcStat } from "../../core/process-identity.ts";

const dirs: string[] = [];
const children: ChildProcess[] = [];
after(() => {
  for (const child of children) child.kill("SIGKILL");
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

function freshDir(): string {
  const dir = mkdtempSync(path.join(os.tmpdir(), "llmgw-build-lock-"));
  dirs.push(dir);
  return dir;
}

/** A pid that no process has now: one of a child that ran and was reaped. */
function deadPid(): number {
  return spawnSync("true").pid ?? 999_999;
}

function bootId(): string {
  return readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim();
}

function sleeper(): { pid: number; start: string; child: ChildProcess } {
  const child = spawn("sleep", ["120"], { stdio: "ignore" });
  children.push(child);
  const pid = child.pid ?? 0;
  return { pid, start: readProcStat(pid)?.start ?? "", child };
}

function builder(fields: Partial<Builder>): Builder {
  return {
    instance: `stale-${Math.random().toString(36).slice(2)}`,
    pid: deadPid(),
    process_start: "1",
    boot_id: bootId(),
    host: os.hostname(),
    since: "2026-12-01T10:00:00.000Z",
    ...fields,
  };
}

function writeLock(dir: string, content: Builder | string, name = LOCK_FILE): void {
  writeFileSync(path.join(dir, name), typeof content === "string" ? content : JSON.stringify(content));
}

function lockText(dir: string): string {
  return readFileSync(path.join(dir, LOCK_FILE), "utf8");
}

function lockHolder(dir: string): Builder {
  return JSON.parse(lockText(dir)) as Builder;
}

test("the lock is created whole and names its builder; no scratch file is left; a release removes only its own lock", async () => {
  const dir = freshDir();
  const lock = await takeBuildLock({ dir });
  const held = lockHolder(dir);
  assert.equal(held.instance, lock.holder.instance);
  assert.equal(held.pid, process.pid);
  assert.equal(held.host, os.hostname());
  assert.equal(held.boot_id, bootId());
  assert.equal(held.process_start, readProcStat(process.pid)?.start);
  assert.deepEqual(readdirSync(dir), [LOCK_FILE]);

  // Someone took the lock over (wrongly, or after this builder was judged gone): not ours to remove.
  const other = builder({ pid: process.pid, process_start: held.process_start });
  writeLock(dir, other);
  lock.release();
  assert.equal(lockHolder(dir).instance, other.instance);
  rmSync(path.join(dir, LOCK_FILE));
  const again = await takeBuildLock({ dir });
  again.release();
  assert.deepEqual(readdirSync(dir), [], "the own lock is removed");
});

test("a live builder is waited for, with a line at once and more while it runs; its lock is taken once it ends", async () => {
  const dir = freshDir();
  const live = sleeper();
  writeLock(dir, builder({ pid: live.pid, process_start: live.start }));
  const waits: string[] = [];
  const taking = takeBuildLock({ dir, pollMs: 10, reportMs: 30, onWait: (detail) => waits.push(detail) });
  await eventually("two wait lines", () => waits.length >= 2);
  assert.match(waits[0] ?? "", new RegExp(`another build of this llama\\.cpp \\(pid ${live.pid}, since .*\\) is running in .*; waiting for it`));
  assert.match(waits[1] ?? "", new RegExp(`still waiting for the build by pid ${live.pid} in `));
  assert.notEqual(lockHolder(dir).pid, process.pid, "not taken while its builder runs");
  live.child.kill("SIGKILL");
  const lock = await taking;
  assert.equal(lockHolder(dir).instance, lock.holder.instance);
  lock.release();
});

test("a gone builder's lock is taken over at once: dead pid, reused pid, earlier boot, an older llmgw's bare pid", async () => {
  const live = sleeper();
  const gone: [string, Builder | string][] = [
    ["a dead pid", builder({})],
    ["a pid now used by another process (another start time)", builder({ pid: live.pid, process_start: "1" })],
    ["a process of an earlier boot", builder({ pid: live.pid, process_start: live.start, boot_id: "00000000-0000-0000-0000-000000000000" })],
    ["an older llmgw's bare pid, dead", `${deadPid()}\n`],
  ];
  for (const [what, content] of gone) {
    const dir = freshDir();
    writeLock(dir, content);
    const waits: string[] = [];
    const lock = await takeBuildLock({ dir, onWait: (detail) => waits.push(detail) });
    assert.deepEqual(waits, [], `${what}: no waiting`);
    assert.equal(lockHolder(dir).instance, lock.holder.instance, what);
    lock.release();
  }
});

test("an older llmgw's bare pid that is alive is waited for, until the build is aborted", async () => {
  const dir = freshDir();
  const live = sleeper();
  writeLock(dir, `${live.pid}\n`);
  const controller = new AbortController();
  const waits: string[] = [];
  const taking = takeBuildLock({ dir, pollMs: 10, signal: controller.signal, onWait: (detail) => waits.push(detail) });
  await eventually("a wait line", () => waits.length > 0);
  assert.match(waits[0] ?? "", new RegExp(`pid ${live.pid}`));
  controller.abort("SIGINT");
  await assert.rejects(taking, (error: Error & { code?: string }) => error.code === "engine_build_interrupted" && /interrupted \(SIGINT\)/.test(error.message));
  assert.equal(lockText(dir), `${live.pid}\n`, "the live builder's lock is left alone");
});

test("an empty or unreadable lock is live while young (an older llmgw creating it), and taken over once 30 s old", async () => {
  for (const content of ["", "{not json"]) {
    const dir = freshDir();
    writeLock(dir, content);
    const waits: string[] = [];
    const taking = takeBuildLock({ dir, pollMs: 10, onWait: (detail) => waits.push(detail) });
    await eventually("a wait line", () => waits.length > 0);
    assert.match(waits[0] ?? "", /build\.lock names no builder yet \(\d+ s old; a starting build writes it\): waiting, and taking it over once it is 30 s old/);
    assert.equal(lockText(dir), content, "not taken while young");
    const old = new Date(Date.now() - 60_000);
    utimesSync(path.join(dir, LOCK_FILE), old, old);
    const lock = await taking;
    assert.equal(lockHolder(dir).instance, lock.holder.instance);
    lock.release();
  }
});

test("a lock from another host is refused with what to do, and left in place", async () => {
  const dir = freshDir();
  const elsewhere = builder({ host: "elsewhere.example", pid: process.pid });
  writeLock(dir, elsewhere);
  await assert.rejects(takeBuildLock({ dir }), (error: Error & { code?: string }) => {
    assert.equal(error.code, "engine_build_locked");
    assert.match(
      error.message,
      /held by a build on host 'elsewhere\.example' \(pid \d+, since .*\); llmgw cannot check .* delete .*build\.lock and run `llmgw engine build` again/,
    );
    return true;
  });
  assert.equal(lockHolder(dir).instance, elsewhere.instance);
});

test("a claim left by a claimant that died midway is claimed in turn; a live claimant is waited for", async () => {
  const dir = freshDir();
  const stale = builder({});
  writeLock(dir, stale);
  writeLock(dir, builder({}), `${LOCK_FILE}.takeover-${stale.instance}`);
  const lock = await takeBuildLock({ dir });
  assert.equal(lockHolder(dir).instance, lock.holder.instance);
  assert.deepEqual(readdirSync(dir), [LOCK_FILE], "no claim or scratch file is left");
  lock.release();

  const stale2 = builder({});
  writeLock(dir, stale2);
  const claimant = sleeper();
  writeLock(dir, builder({ pid: claimant.pid, process_start: claimant.start }), `${LOCK_FILE}.takeover-${stale2.instance}`);
  const controller = new AbortController();
  const waits: string[] = [];
  const taking = takeBuildLock({ dir, pollMs: 10, signal: controller.signal, onWait: (detail) => waits.push(detail) });
  await eventually("a wait line", () => waits.length > 0);
  assert.match(waits[0] ?? "", new RegExp(`pid ${claimant.pid}`));
  controller.abort();
  await assert.rejects(taking, /interrupted/);
  assert.equal(lockHolder(dir).instance, stale2.instance, "the stale lock is left to its claimant");
});

test("a builder about to take over a stale lock that a racer takes first waits for the racer instead of also winning", async () => {
  const dir = freshDir();
  writeLock(dir, builder({}));
  const racer = sleeper();
  const racersLock = builder({ pid: racer.pid, process_start: racer.start });
  const controller = new AbortController();
  const waits: string[] = [];
  const taking = takeBuildLock({
    dir,
    pollMs: 10,
    signal: controller.signal,
    onWait: (detail) => waits.push(detail),
    // The racer found the same stale lock and replaced it first, as a takeover does (a rename).
    beforeTakeover: () => writeLock(dir, racersLock),
  });
  await eventually("a wait line", () => waits.length > 0);
  assert.match(waits[0] ?? "", new RegExp(`pid ${racer.pid}`));
  controller.abort();
  await assert.rejects(taking, /interrupted/);
  assert.equal(lockHolder(dir).instance, racersLock.instance, "the racer keeps the lock");
  assert.deepEqual(readdirSync(dir), [LOCK_FILE]);
});

test("of several processes racing for one stale lock, one holds it at a time, and each gets it in turn", { timeout: 180_000 }, async () => {
  const dir = freshDir();
  writeLock(dir, builder({}));
  const tsx = import.meta.resolve("tsx");
  const lockModule = fileURLToPath(new URL("./build-lock.ts", import.meta.url));
  // Holds the lock until told to release it; says "waiting" each time it finds it held.
  const contender = `
    const { takeBuildLock } = await import(${JSON.stringify(lockModule)});
    const say = (line) => process.stdout.write(line + "\\n");
    say("ready");
    let lock;
    process.stdin.setEncoding("utf8");
    process.stdin.on("data", async (text) => {
      if (text.includes("go")) {
        lock = await takeBuildLock({ dir: ${JSON.stringify(dir)}, pollMs: 5, reportMs: 0, onWait: () => say("waiting") });
        say("won " + process.pid);
      }
      if (text.includes("release")) { lock.release(); say("released"); process.exit(0); }
    });`;
  const racers = Array.from({ length: 4 }, () => {
    const child = spawn(process.execPath, ["--import", tsx, "--input-type=module", "-e", contender], { stdio: ["pipe", "pipe", "inherit"] });
    children.push(child);
    let out = "";
    child.stdout?.on("data", (chunk: Buffer) => {
      out += chunk.toString();
    });
    return { child, out: () => out, waits: () => out.split("\n").filter((line) => line === "waiting").length };
  });
  await eventually("every racer to be ready", () => racers.every((racer) => racer.out().startsWith("ready")), { timeoutMs: 120_000 });
  for (const racer of racers) racer.child.stdin?.write("go\n");
  const holding = () => racers.filter((racer) => racer.out().includes("\nwon ") && !racer.out().includes("released"));
  const served = new Set<ChildProcess>();
  for (let round = 0; round < racers.length; round += 1) {
    const waiting = racers.filter((racer) => !racer.out().includes("\nwon "));
    const before = new Map(waiting.map((racer) => [racer, racer.waits()]));
    const winner = await eventually(`a holder in round ${round}`, () => holding()[0]);
    // Every other contender has since looked again and found the lock held.
    const others = waiting.filter((racer) => racer !== winner);
    await eventually("the others to look again", () => others.every((racer) => racer.waits() > (before.get(racer) ?? 0) + 1));
    assert.equal(holding().length, 1, racers.map((racer) => racer.out()).join("\n---\n"));
    assert.equal(lockHolder(dir).pid, winner.child.pid);
    assert.ok(!served.has(winner.child));
    served.add(winner.child);
    winner.child.stdin?.write("release\n");
    await eventually("the release", () => winner.out().includes("released"));
  }
  assert.equal(served.size, racers.length, "each got the lock once");
  assert.deepEqual(readdirSync(dir), [], "no lock, claim or scratch file is left");
});
