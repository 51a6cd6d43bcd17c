// Local sources on real files in a temporary folder: listing without reading, hashing on
// request with the remembered hashes, split siblings, Hugging Face cache-style symlinks,
// files this process may not read, and the errors for paths that are not there.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rm, symlink, utimes, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { BadRequestError, NotFoundError, PermissionDeniedError } from "../core/errors.ts";
import { makeUnreadableFile } from "../../test/support/stand-in-repos.ts";
import { chooseArtifact, classifyFiles } from "./file-sets.ts";
import { gitBlobId } from "./hub-client.ts";
import { assertLocalFilesReadable, hashLocalFiles, isLocalSource, listLocalSource, localSourceId } from "./local-source.ts";

let work: string;
let dataDir: string;

before(async () => {
  work = await mkdtemp(join(tmpdir(), "llmgw-local-source-"));
  dataDir = join(work, "data");
});

after(async () => {
  await rm(work, { recursive: true, force: true });
});

const sha256 = (bytes: Buffer): string => createHash("sha256").update(bytes).digest("hex");
const cachePath = (dir: string) => join(dir, "registry", "local-hashes.json");

test("a relative file path is listed without reading it, then hashed once and remembered by path, size and mtime", async () => {
  const models = join(work, "single", "models");
  await mkdir(models, { recursive: true });
  const bytes = Buffer.from("GGUF first version of the weights");
  const path = join(models, "tiny-Q4_K_M.gguf");
  await writeFile(path, bytes);
  // Whole seconds, so the mtime can be put back exactly below.
  const mtime = new Date("2025-01-02T03:04:05Z");
  await utimes(path, mtime, mtime);
  const cwd = join(work, "single");

  const listing = await listLocalSource({ source: "./models/tiny-Q4_K_M.gguf", cwd });
  assert.equal(listing.repo, pathToFileURL(path).href);
  assert.equal(listing.revision, "local");
  assert.equal(listing.root, models);
  assert.deepEqual(listing.files, [{ path: "tiny-Q4_K_M.gguf", size: bytes.length, mtimeMs: mtime.getTime(), absolute: path }]);
  assert.match(listing.sha, /^[0-9a-f]{64}$/);
  assert.equal(listing.sha, localSourceId(listing.files));
  assert.equal(listing.shortSha, listing.sha.slice(0, 12));
  assert.equal(existsSync(cachePath(dataDir)), false, "listing hashes nothing, so it remembers nothing");

  const first = await hashLocalFiles({ files: listing.files, dataDir });
  assert.deepEqual(first.files, [{ path: "tiny-Q4_K_M.gguf", size: bytes.length, sha256: sha256(bytes), blobId: gitBlobId(bytes) }]);
  assert.deepEqual([first.hashed, first.fromCache], [1, 0]);
  const cache = JSON.parse(await readFile(cachePath(dataDir), "utf8")) as { files: Record<string, { sha256: string }> };
  assert.equal(Object.values(cache.files).find((entry) => entry.sha256 === sha256(bytes))?.sha256, sha256(bytes));

  // Same size and mtime, different bytes: the remembered hash is used, so the file was not read again.
  const other = Buffer.from("GGUF other version of the weights");
  assert.equal(other.length, bytes.length);
  await writeFile(path, other);
  await utimes(path, mtime, mtime);
  const again = await listLocalSource({ source: "./models/tiny-Q4_K_M.gguf", cwd });
  assert.equal(again.sha, listing.sha, "the same path, size and mtime are the same listing");
  const second = await hashLocalFiles({ files: again.files, dataDir });
  assert.deepEqual([second.hashed, second.fromCache], [0, 1]);
  assert.equal(second.files[0]?.sha256, sha256(bytes));

  // A new mtime means new content: a new listing id, and hashed again.
  await utimes(path, mtime, new Date(mtime.getTime() + 5_000));
  const touched = await listLocalSource({ source: pathToFileURL(path).href });
  assert.notEqual(touched.sha, listing.sha);
  const third = await hashLocalFiles({ files: touched.files, dataDir });
  assert.equal(third.hashed, 1);
  assert.equal(third.files[0]?.sha256, sha256(other));

  // Hashing a listing that is out of date is refused rather than hashing other bytes.
  await utimes(path, mtime, new Date(mtime.getTime() + 9_000));
  await assert.rejects(
    hashLocalFiles({ files: touched.files, dataDir }),
    (error: unknown) => error instanceof BadRequestError && error.code === "local_source_changed" && error.message.includes(path),
  );
});

test("a folder lists every file below it, skips dot entries, and follows Hugging Face cache links", async () => {
  const root = join(work, "folder");
  const snapshot = join(root, "snapshots", "abc");
  const blobs = join(root, "blobs");
  await mkdir(join(snapshot, "Q2_K"), { recursive: true });
  await mkdir(join(snapshot, ".cache", "huggingface"), { recursive: true });
  await mkdir(blobs, { recursive: true });
  const weights = Buffer.from("GGUF weights shared by two links");
  await writeFile(join(blobs, sha256(weights)), weights);
  await symlink(join(blobs, sha256(weights)), join(snapshot, "m-Q4_K_M.gguf"));
  await symlink(join("..", "..", "blobs", sha256(weights)), join(snapshot, "m-Q8_0.gguf"));
  await writeFile(join(snapshot, "Q2_K", "m-Q2_K-00001-of-00002.gguf"), "part one");
  await writeFile(join(snapshot, "Q2_K", "m-Q2_K-00002-of-00002.gguf"), "part two");
  await writeFile(join(snapshot, ".cache", "huggingface", "download.lock"), "");
  await writeFile(join(snapshot, ".gitattributes"), "*.gguf filter=lfs");

  const listing = await listLocalSource({ source: snapshot });
  assert.deepEqual(
    listing.files.map((f) => [f.path, f.size]),
    [
      ["Q2_K/m-Q2_K-00001-of-00002.gguf", 8],
      ["Q2_K/m-Q2_K-00002-of-00002.gguf", 8],
      ["m-Q4_K_M.gguf", weights.length],
      ["m-Q8_0.gguf", weights.length],
    ],
  );
  // The listing classifies like a Hub repository.
  const chosen = chooseArtifact({ sets: classifyFiles(listing.files), quant: "Q2_K" });
  assert.equal(chosen.files.length, 2);

  // Both links point at one blob: it is read once.
  const hashed = await hashLocalFiles({ files: listing.files, dataDir });
  assert.deepEqual([hashed.hashed, hashed.fromCache], [3, 1]);
  assert.equal(hashed.files.find((f) => f.path === "m-Q8_0.gguf")?.sha256, sha256(weights));
});

test("a split part brings its sibling parts", async () => {
  const dir = join(work, "split");
  await mkdir(dir, { recursive: true });
  await writeFile(join(dir, "big-Q4_K_M-00001-of-00002.gguf"), "one");
  await writeFile(join(dir, "big-Q4_K_M-00002-of-00002.gguf"), "two");
  await writeFile(join(dir, "unrelated.gguf"), "other");
  const listing = await listLocalSource({ source: join(dir, "big-Q4_K_M-00001-of-00002.gguf") });
  assert.deepEqual(
    listing.files.map((f) => f.path),
    ["big-Q4_K_M-00001-of-00002.gguf", "big-Q4_K_M-00002-of-00002.gguf"],
  );
});

test("listing opens no file: a file this process may not read is listed, and refused with a 403 naming it only when it is read", async (t) => {
  const dir = join(work, "unreadable");
  await mkdir(dir, { recursive: true });
  await writeFile(join(dir, "m-Q4_K_M.gguf"), "GGUF readable");
  const unreadable = join(dir, "m-Q8_0.gguf");
  if (!(await makeUnreadableFile(unreadable))) {
    t.skip("no way to make a file this process cannot read here");
    return;
  }
  const listing = await listLocalSource({ source: dir });
  assert.deepEqual(
    listing.files.map((f) => f.path),
    ["m-Q4_K_M.gguf", "m-Q8_0.gguf"],
  );
  const readable = listing.files.filter((f) => f.path === "m-Q4_K_M.gguf");
  await assertLocalFilesReadable(readable);
  assert.equal((await hashLocalFiles({ files: readable, dataDir })).files.length, 1);

  const refused = (error: unknown): boolean => {
    assert.ok(error instanceof PermissionDeniedError, String(error));
    assert.equal(error.status, 403);
    assert.equal(error.code, "local_source_unreadable");
    assert.ok(error.message.includes(unreadable), error.message);
    assert.match(error.message, /permission denied/);
    return true;
  };
  await assert.rejects(assertLocalFilesReadable(listing.files), refused);
  await assert.rejects(hashLocalFiles({ files: listing.files, dataDir }), refused);
});

test("a folder of more than 10 000 files is refused as the wrong folder", async () => {
  const dir = join(work, "huge");
  await mkdir(dir, { recursive: true });
  await Promise.all(Array.from({ length: 10_001 }, (_, i) => writeFile(join(dir, `f${i}.txt`), "")));
  await assert.rejects(
    listLocalSource({ source: dir }),
    (error: unknown) => error instanceof BadRequestError && error.code === "local_source_too_large" && error.message.includes("10000"),
  );
});

test("an aborted listing stops with the caller's reason", async () => {
  const reason = new Error("the client went away");
  await assert.rejects(listLocalSource({ source: join(work), signal: AbortSignal.abort(reason) }), (error: unknown) => error === reason);
});

test("a path that does not exist, a broken link and a bad file URL are clear errors", async () => {
  await assert.rejects(listLocalSource({ source: "./no/such/model.gguf", cwd: work }), (error: unknown) => {
    assert.ok(error instanceof NotFoundError);
    assert.equal(error.code, "local_source_not_found");
    assert.ok(error.message.includes(join(work, "no/such/model.gguf")), error.message);
    return true;
  });
  const dir = join(work, "broken");
  await mkdir(dir, { recursive: true });
  await symlink(join(dir, "gone.gguf"), join(dir, "model.gguf"));
  await assert.rejects(
    listLocalSource({ source: dir }),
    (error: unknown) => error instanceof BadRequestError && error.code === "local_source_broken_link" && error.message.includes("model.gguf"),
  );
  await assert.rejects(
    listLocalSource({ source: "file://remote-host/x.gguf" }),
    (error: unknown) => error instanceof BadRequestError && error.code === "invalid_local_source",
  );
  const empty = join(work, "empty");
  await mkdir(empty, { recursive: true });
  await assert.rejects(listLocalSource({ source: empty }), (error: unknown) => error instanceof NotFoundError && error.code === "local_source_empty");
});

test("isLocalSource tells paths from repository ids", () => {
  for (const local of ["./models/x.gguf", "../x", "/srv/models", "~/models/x.gguf", "file:///srv/x.gguf", "."]) assert.equal(isLocalSource(local), true, local);
  for (const repo of ["bartowski/Llama-3.2-1B-Instruct-GGUF", "models/x", "owner/name"]) assert.equal(isLocalSource(repo), false, repo);
});
