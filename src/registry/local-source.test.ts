// Local sources on real files in a temporary folder: hashing, the remembered hashes, split
// siblings, Hugging Face cache-style symlinks, and the errors for paths that are not there.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { mkdir, mkdtemp, readFile, rm, symlink, utimes, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { BadRequestError, NotFoundError } from "../core/errors.ts";
import { chooseArtifact, classifyFiles } from "./file-sets.ts";
import { gitBlobId } from "./hub-client.ts";
import { isLocalSource, readLocalSource } from "./local-source.ts";

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

test("a relative file path is hashed once and remembered by path, size and mtime", async () => {
  const models = join(work, "single", "models");
  await mkdir(models, { recursive: true });
  const bytes = Buffer.from("GGUF first version of the weights");
  const path = join(models, "tiny-Q4_K_M.gguf");
  await writeFile(path, bytes);
  // Whole seconds, so the mtime can be put back exactly below.
  const mtime = new Date("2025-01-02T03:04:05Z");
  await utimes(path, mtime, mtime);
  const cwd = join(work, "single");

  const first = await readLocalSource({ source: "./models/tiny-Q4_K_M.gguf", cwd, dataDir });
  assert.equal(first.repo, pathToFileURL(path).href);
  assert.equal(first.revision, "local");
  assert.equal(first.root, models);
  assert.deepEqual(first.files, [{ path: "tiny-Q4_K_M.gguf", size: bytes.length, sha256: sha256(bytes), blobId: gitBlobId(bytes) }]);
  assert.match(first.sha, /^[0-9a-f]{64}$/);
  assert.equal(first.shortSha, first.sha.slice(0, 12));
  assert.equal(first.hashed, 1);
  assert.equal(first.fromCache, 0);
  const cache = JSON.parse(await readFile(join(dataDir, "registry", "local-hashes.json"), "utf8")) as { files: Record<string, { sha256: string }> };
  assert.equal(Object.values(cache.files).find((entry) => entry.sha256 === sha256(bytes))?.sha256, sha256(bytes));

  // Same size and mtime, different bytes: the remembered hash is used, so the file was not read again.
  const other = Buffer.from("GGUF other version of the weights");
  assert.equal(other.length, bytes.length);
  await writeFile(path, other);
  await utimes(path, mtime, mtime);
  const second = await readLocalSource({ source: "./models/tiny-Q4_K_M.gguf", cwd, dataDir });
  assert.equal(second.hashed, 0);
  assert.equal(second.fromCache, 1);
  assert.equal(second.files[0]?.sha256, sha256(bytes));
  assert.equal(second.sha, first.sha);

  // A new mtime means new content: hashed again.
  await utimes(path, mtime, new Date(mtime.getTime() + 5_000));
  const third = await readLocalSource({ source: pathToFileURL(path).href, dataDir });
  assert.equal(third.hashed, 1);
  assert.equal(third.files[0]?.sha256, sha256(other));
  assert.notEqual(third.sha, first.sha);
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

  const info = await readLocalSource({ source: snapshot, dataDir });
  assert.deepEqual(
    info.files.map((f) => f.path),
    ["Q2_K/m-Q2_K-00001-of-00002.gguf", "Q2_K/m-Q2_K-00002-of-00002.gguf", "m-Q4_K_M.gguf", "m-Q8_0.gguf"],
  );
  // Both links point at one blob: it is read once.
  assert.equal(info.hashed, 3);
  assert.equal(info.fromCache, 1);
  assert.equal(info.files.find((f) => f.path === "m-Q8_0.gguf")?.sha256, sha256(weights));

  // The result classifies like a Hub repository.
  const chosen = chooseArtifact({ sets: classifyFiles(info.files), quant: "Q2_K" });
  assert.equal(chosen.files.length, 2);
});

test("a split part brings its sibling parts", async () => {
  const dir = join(work, "split");
  await mkdir(dir, { recursive: true });
  await writeFile(join(dir, "big-Q4_K_M-00001-of-00002.gguf"), "one");
  await writeFile(join(dir, "big-Q4_K_M-00002-of-00002.gguf"), "two");
  await writeFile(join(dir, "unrelated.gguf"), "other");
  const info = await readLocalSource({ source: join(dir, "big-Q4_K_M-00001-of-00002.gguf"), dataDir });
  assert.deepEqual(
    info.files.map((f) => f.path),
    ["big-Q4_K_M-00001-of-00002.gguf", "big-Q4_K_M-00002-of-00002.gguf"],
  );
});

test("a path that does not exist, a broken link and a bad file URL are clear errors", async () => {
  await assert.rejects(readLocalSource({ source: "./no/such/model.gguf", cwd: work, dataDir }), (error: unknown) => {
    assert.ok(error instanceof NotFoundError);
    assert.equal(error.code, "local_source_not_found");
    assert.ok(error.message.includes(join(work, "no/such/model.gguf")), error.message);
    return true;
  });
  const dir = join(work, "broken");
  await mkdir(dir, { recursive: true });
  await symlink(join(dir, "gone.gguf"), join(dir, "model.gguf"));
  await assert.rejects(readLocalSource({ source: dir, dataDir }), (error: unknown) => error instanceof BadRequestError && error.code === "local_source_broken_link" && error.message.includes("model.gguf"));
  await assert.rejects(readLocalSource({ source: "file://remote-host/x.gguf", dataDir }), (error: unknown) => error instanceof BadRequestError && error.code === "invalid_local_source");
  const empty = join(work, "empty");
  await mkdir(empty, { recursive: true });
  await assert.rejects(readLocalSource({ source: empty, dataDir }), (error: unknown) => error instanceof NotFoundError && error.code === "local_source_empty");
});

test("isLocalSource tells paths from repository ids", () => {
  for (const local of ["./models/x.gguf", "../x", "/srv/models", "~/models/x.gguf", "file:///srv/x.gguf", "."]) assert.equal(isLocalSource(local), true, local);
  for (const repo of ["bartowski/Llama-3.2-1B-Instruct-GGUF", "models/x", "owner/name"]) assert.equal(isLocalSource(repo), false, repo);
});
