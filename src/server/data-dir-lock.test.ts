// The data dir lock: one holder at a time, named when refused; a lock whose process is
// gone (dead, reused PID, earlier boot) is taken over, by exactly one of several racers.
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import os, { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { ConflictError } from "../core/errors.ts";
import { acquireDataDirLock, readProcessStat, type LockHolder } from "./data-dir-lock.ts";
import { eventually } from "../../test/support/eventually.ts";

const dirs: string[] = [];
const children: ChildProcess[] = [];
after(() => {
  for (const child of children) child.kill("SIGKILL");
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

function freshDir(): string {
  const dir = mkdtempSync(path.join(tmpdir(), "llmgw-lock-"));
  dirs.push(dir);
  return dir;
}

/** A PID that no process has now: one of a child that ran and was reaped. */
function deadPid(): number {
  return spawnSync("true").pid!;
}

function bootId(): string {
  return readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim();
}

function holder(fields: Partial<LockHolder>): LockHolder {
  return {
    instance: `stale-${Math.random().toString(36).slice(2)}`,
    pid: deadPid(),
    process_start: "1",
    boot_id: bootId(),
    host: os.hostname(),
    address: "http://127.0.0.1:8700",
    listening: true,
    started_at: "2026-11-30T10:00:00.000Z",
    ...fields,
  };
}

function writeLock(dir: string, content: LockHolder, name = "server.lock"): void {
  writeFileSync(path.join(dir, name), JSON.stringify(content));
}

function lockContent(dir: string): LockHolder {
  return JSON.parse(readFileSync(path.join(dir, "server.lock"), "utf8")) as LockHolder;
}

function sleeper(): ChildProcess {
  const child = spawn("sleep", ["120"], { stdio: "ignore" });
  children.push(child);
  return child;
}

test("a data dir has one holder: a second one is refused with the PID and address; release frees it", () => {
  const dir = freshDir();
  const lock = acquireDataDirLock({ dataDir: dir, address: "127.0.0.1:0" });
  assert.equal(lockContent(dir).pid, process.pid);
  lock.setAddress("http://127.0.0.1:41234");
  assert.deepEqual({ address: lockContent(dir).address, listening: lockContent(dir).listening }, { address: "http://127.0.0.1:41234", listening: true });
  assert.throws(
    () => acquireDataDirLock({ dataDir: dir, address: "127.0.0.1:0" }),
    (error: unknown) =>
      error instanceof ConflictError &&
      error.code === "data_dir_in_use" &&
      error.message.includes(`in use by another llmgw (PID ${process.pid}, listening on http://127.0.0.1:41234`),
  );
  lock.release();
  assert.equal(existsSync(path.join(dir, "server.lock")), false);
  acquireDataDirLock({ dataDir: dir, address: "127.0.0.1:0" }).release();
});

test("a lock whose process is gone, or whose PID now runs another process, is taken over", () => {
  const dir = freshDir();
  writeLock(dir, holder({}));
  const lock = acquireDataDirLock({ dataDir: dir, address: "127.0.0.1:0" });
  assert.equal(lockContent(dir).instance, lock.holder.instance);
  lock.release();

  const other = sleeper();
  writeLock(dir, holder({ pid: other.pid!, process_start: "1" }));
  const reused = acquireDataDirLock({ dataDir: dir, address: "127.0.0.1:0" });
  assert.equal(lockContent(dir).pid, process.pid, "a live PID with another start time is not the holder");
  reused.release();

  writeLock(dir, holder({ pid: other.pid!, process_start: readProcessStat(other.pid!)!.start }));
  assert.throws(() => acquireDataDirLock({ dataDir: dir, address: "127.0.0.1:0" }), new RegExp(`PID ${other.pid}, listening on http://127.0.0.1:8700`));
});

test("a lock from before a reboot is taken over; one from another host is refused with what to do", () => {
  const dir = freshDir();
  const other = sleeper();
  const start = readProcessStat(other.pid!)!.start;
  writeLock(dir, holder({ pid: other.pid!, process_start: start, boot_id: "00000000-0000-0000-0000-000000000000" }));
  acquireDataDirLock({ dataDir: dir, address: "127.0.0.1:0" }).release();

  writeLock(dir, holder({ host: "elsewhere.example", pid: other.pid!, process_start: start }));
  assert.throws(
    () => acquireDataDirLock({ dataDir: dir, address: "127.0.0.1:0" }),
    (error: unknown) => error instanceof ConflictError && /on host 'elsewhere\.example'.*delete .*server\.lock and start again/.test(error.message),
  );
});

test("a takeover claim left by a claimant that died midway is claimed in turn, and the claims are cleaned up", () => {
  const dir = freshDir();
  const stale = holder({});
  writeLock(dir, stale);
  const deadClaimant = holder({});
  writeLock(dir, deadClaimant, `server.lock.takeover-${stale.instance}`);
  const lock = acquireDataDirLock({ dataDir: dir, address: "127.0.0.1:0" });
  assert.equal(lockContent(dir).instance, lock.holder.instance);
  assert.deepEqual(readdirSync(dir), ["server.lock"], "no claim or scratch file is left");
  lock.release();
});

test("a live claimant is waited for, not overtaken", () => {
  const dir = freshDir();
  const stale = holder({});
  writeLock(dir, stale);
  const claimant = sleeper();
  writeLock(dir, holder({ pid: claimant.pid!, process_start: readProcessStat(claimant.pid!)!.start }), `server.lock.takeover-${stale.instance}`);
  assert.throws(
    () => acquireDataDirLock({ dataDir: dir, address: "127.0.0.1:0", takeoverWaitMs: 100 }),
    new RegExp(`being taken over by another starting llmgw \\(PID ${claimant.pid}`),
  );
  assert.equal(lockContent(dir).instance, stale.instance, "the stale lock is left to its claimant");
});

test("a server that takes over a stale lock while another is about to cannot both win", () => {
  const dir = freshDir();
  writeLock(dir, holder({}));
  let first: ReturnType<typeof acquireDataDirLock> | undefined;
  // The second server finds the lock stale; before it acts, the first one takes it over.
  const second = () =>
    acquireDataDirLock({
      dataDir: dir,
      address: "127.0.0.1:2",
      beforeTakeover: () => {
        first = acquireDataDirLock({ dataDir: dir, address: "127.0.0.1:1" });
      },
    });
  assert.throws(second, (error: unknown) => error instanceof ConflictError && error.message.includes("starting on 127.0.0.1:1"));
  assert.equal(lockContent(dir).instance, first!.holder.instance, "the first taker keeps the lock");
  assert.deepEqual(readdirSync(dir), ["server.lock"]);
  first!.release();
});

test("of several processes taking over one stale lock at the same moment, exactly one wins", { timeout: 120_000 }, async () => {
  const dir = freshDir();
  writeLock(dir, holder({}));
  const contender = fileURLToPath(new URL("../../test/support/lock-contender.ts", import.meta.url));
  const racers = Array.from({ length: 4 }, () => {
    const child = spawn(process.execPath, ["--import", "tsx", contender, dir], { stdio: ["pipe", "pipe", "inherit"] });
    children.push(child);
    let out = "";
    child.stdout!.on("data", (chunk: Buffer) => (out += chunk.toString()));
    return { child, out: () => out };
  });
  await eventually("every racer to be ready", () => racers.every((racer) => racer.out().startsWith("ready")), { timeoutMs: 90_000 });
  for (const racer of racers) racer.child.stdin!.write("go\n");
  await eventually("every racer to be done", () => racers.every((racer) => /\n(won|refused)/.test(racer.out())), { timeoutMs: 60_000 });
  const winners = racers.filter((racer) => racer.out().includes("\nwon "));
  assert.equal(winners.length, 1, racers.map((racer) => racer.out()).join("\n"));
  const winnerPid = winners[0]!.child.pid!;
  assert.equal(lockContent(dir).pid, winnerPid);
  for (const racer of racers.filter((r) => r !== winners[0])) {
    assert.match(racer.out(), new RegExp(`refused .*(in use by another llmgw|being taken over by another starting llmgw) \\(PID ${winnerPid},`));
  }
});
