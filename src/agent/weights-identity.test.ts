// The identity check before an engine start, on real files: what passes, what is refused
// and with which code, and that a verified stamp spares the next check (and the next
// agent process, through the memo file) from reading the file again.
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { mkdir, mkdtemp, open, readFile, rm, stat, symlink, utimes, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileClockPast } from "../../test/support/fs-clock.ts";
import { WeightsIdentity, WeightsIdentityError } from "./weights-identity.ts";

const dirs: string[] = [];
after(async () => {
  await Promise.all(dirs.map((dir) => rm(dir, { recursive: true, force: true })));
});

async function tempDir(): Promise<string> {
  const dir = await mkdtemp(path.join(tmpdir(), "llmgw-identity-"));
  dirs.push(dir);
  return dir;
}

async function weightsFile(dir: string, name = "model.gguf", bytes = 300_000): Promise<{ path: string; bytes: number; sha256: string; content: Buffer }> {
  const content = randomBytes(bytes);
  const file = path.join(dir, name);
  await writeFile(file, content);
  return { path: file, bytes, sha256: createHash("sha256").update(content).digest("hex"), content };
}

/** Overwrites one byte in place: same inode, same size. */
async function flipByte(file: string, at: number): Promise<void> {
  const handle = await open(file, "r+");
  try {
    const one = Buffer.alloc(1);
    await handle.read(one, 0, 1, at);
    one[0] = (one[0] ?? 0) ^ 0xff;
    await handle.write(one, 0, 1, at);
  } finally {
    await handle.close();
  }
}

async function refusal(promise: Promise<unknown>): Promise<WeightsIdentityError> {
  try {
    await promise;
  } catch (error) {
    assert.ok(error instanceof WeightsIdentityError, `expected a WeightsIdentityError, got ${String(error)}`);
    return error;
  }
  assert.fail("the check passed");
}

test("a regular file with the published size and sha256 passes, and is hashed once across checks and across agent restarts", async () => {
  const dir = await tempDir();
  const memoFile = path.join(dir, "state", "weights-verified.json");
  const file = await weightsFile(dir);
  const expected = [{ path: file.path, bytes: file.bytes, sha256: file.sha256 }];

  const identity = new WeightsIdentity({ memoFile });
  await identity.verify(expected);
  assert.equal(identity.hashedCount(), 1);
  await identity.verify(expected);
  assert.equal(identity.hashedCount(), 1, "the second check reused the verified stamp");

  const memo = JSON.parse(await readFile(memoFile, "utf8"));
  assert.equal(memo.files[file.path].sha256, file.sha256);
  assert.equal(memo.files[file.path].size, file.bytes);

  // A new agent process: the memo file carries the verification over.
  const restarted = new WeightsIdentity({ memoFile });
  await restarted.verify(expected);
  assert.equal(restarted.hashedCount(), 0, "the restarted agent did not read the file");

  // The memo is tied to the sha256 it verified: another expectation is checked for real.
  const other = await refusal(restarted.verify([{ ...expected[0]!, sha256: "0".repeat(64) }]));
  assert.equal(other.code, "weights_sha256_mismatch");
  assert.equal(restarted.hashedCount(), 1);
});

test("a byte changed in place is caught: a new mtime, or an mtime put back (ctime still moves), means hashing again", async () => {
  const dir = await tempDir();
  const file = await weightsFile(dir);
  const expected = [{ path: file.path, bytes: file.bytes, sha256: file.sha256 }];
  const identity = new WeightsIdentity({});
  await identity.verify(expected);
  assert.equal(identity.hashedCount(), 1);

  // Touching the file (same bytes) changes the stamp: hashed again, and it still passes.
  const later = new Date(Math.floor(Date.now() / 1000) * 1000 + 5_000);
  await utimes(file.path, later, later);
  await identity.verify(expected);
  assert.equal(identity.hashedCount(), 2, "a touched file is hashed again");

  // A changed byte with the size kept and the mtime put back afterwards. The kernel stamps
  // times from a coarse clock (a few ms a tick), so first wait until a change made now gets
  // a later ctime than the one just verified: a change within the same tick looks the same.
  const verified = await stat(file.path, { bigint: true });
  await fileClockPast(dir, verified.ctimeNs);
  await flipByte(file.path, 1234);
  await utimes(file.path, later, later);
  const changed = await stat(file.path, { bigint: true });
  assert.equal(changed.mtimeNs, verified.mtimeNs, "the mtime was put back");
  assert.equal(changed.ino, verified.ino, "the same file, changed in place");
  const error = await refusal(identity.verify(expected));
  assert.equal(identity.hashedCount(), 3);
  assert.equal(error.code, "weights_sha256_mismatch");
  assert.equal(error.status, 400);
  assert.equal(error.file, file.path);
  assert.match(error.message, new RegExp(`${file.path} has sha256 [0-9a-f]{64}, but the server published ${file.sha256}`));
  assert.match(error.message, /Restore the file/);

  // A refused file is not remembered: restoring it makes it pass again, after a real hash.
  await flipByte(file.path, 1234);
  await identity.verify(expected);
  assert.equal(identity.hashedCount(), 4);
});

test("a symbolic link is refused, naming its target, even when it points at the right bytes", async () => {
  const dir = await tempDir();
  const file = await weightsFile(dir);
  const link = path.join(dir, "link.gguf");
  await symlink(file.path, link);
  const identity = new WeightsIdentity({});
  const error = await refusal(identity.verify([{ path: link, bytes: file.bytes, sha256: file.sha256 }]));
  assert.equal(error.code, "weights_symlink");
  assert.match(error.message, new RegExp(`${link} is a symbolic link \\(to ${file.path}\\)`));
  assert.match(error.message, /Replace the link with the file itself/);
  assert.equal(identity.hashedCount(), 0);
});

test("a missing file, a folder and a file of another size are refused without reading it", async () => {
  const dir = await tempDir();
  const file = await weightsFile(dir);
  const identity = new WeightsIdentity({});

  const missing = await refusal(identity.verify([{ path: path.join(dir, "gone.gguf"), bytes: 10, sha256: file.sha256 }]));
  assert.equal(missing.code, "weights_missing");
  assert.match(missing.message, /gone\.gguf does not exist \(expected 10 bytes/);

  const folder = path.join(dir, "folder.gguf");
  await mkdir(folder);
  const notFile = await refusal(identity.verify([{ path: folder, bytes: 10, sha256: file.sha256 }]));
  assert.equal(notFile.code, "weights_not_file");
  assert.match(notFile.message, /is a folder/);

  const size = await refusal(identity.verify([{ path: file.path, bytes: file.bytes + 1, sha256: file.sha256 }]));
  assert.equal(size.code, "weights_size_mismatch");
  assert.match(size.message, new RegExp(`is ${file.bytes} bytes, but the server published ${file.bytes + 1} bytes`));
  assert.equal(identity.hashedCount(), 0);
});

test("a file of the wrong sha256 is refused, and files below the cache root say the agent fetches them again", async () => {
  const dir = await tempDir();
  const cacheRoot = path.join(dir, "weights");
  await mkdir(path.join(cacheRoot, "m", "v1"), { recursive: true });
  const file = await weightsFile(path.join(cacheRoot, "m", "v1"));
  const identity = new WeightsIdentity({ cacheRoot });
  const wrong = createHash("sha256").update("something else").digest("hex");
  const error = await refusal(identity.verify([{ path: file.path, bytes: file.bytes, sha256: wrong }]));
  assert.equal(error.code, "weights_sha256_mismatch");
  assert.match(error.message, new RegExp(`has sha256 ${file.sha256}, but the server published ${wrong}`));
  assert.match(error.message, /the agent removes it and fetches it again/);
  // Nothing was remembered for the wrong expectation: the same check reads the file again.
  await refusal(identity.verify([{ path: file.path, bytes: file.bytes, sha256: wrong }]));
  assert.equal(identity.hashedCount(), 2);
});

test("checks of the same file at the same time read it once; a damaged memo file costs a re-hash, not a failure", async () => {
  const dir = await tempDir();
  const memoFile = path.join(dir, "memo.json");
  const file = await weightsFile(dir, "big.gguf", 4 * 1024 * 1024);
  const expected = [{ path: file.path, bytes: file.bytes, sha256: file.sha256 }];
  const identity = new WeightsIdentity({ memoFile });
  await Promise.all([identity.verify(expected), identity.verify(expected), identity.verify(expected)]);
  assert.equal(identity.hashedCount(), 1);

  await writeFile(memoFile, "{ not json");
  const restarted = new WeightsIdentity({ memoFile });
  await restarted.verify(expected);
  assert.equal(restarted.hashedCount(), 1);
  // And it wrote a good memo again.
  assert.equal(JSON.parse(await readFile(memoFile, "utf8")).files[file.path].sha256, file.sha256);
});

test("remember records bytes hashed elsewhere (a download), and forget drops a folder's files", async () => {
  const dir = await tempDir();
  const file = await weightsFile(dir);
  const expected = { path: file.path, bytes: file.bytes, sha256: file.sha256 };
  const identity = new WeightsIdentity({});
  await identity.remember(expected);
  await identity.verify([expected]);
  assert.equal(identity.hashedCount(), 0);
  await identity.forget(dir);
  await identity.verify([expected]);
  assert.equal(identity.hashedCount(), 1);
});

test("an aborted check rejects with the reason", async () => {
  const dir = await tempDir();
  const file = await weightsFile(dir);
  const identity = new WeightsIdentity({});
  const controller = new AbortController();
  controller.abort(new Error("replica stopped"));
  await assert.rejects(identity.verify([{ path: file.path, bytes: file.bytes, sha256: file.sha256 }], controller.signal), /replica stopped/);
});
