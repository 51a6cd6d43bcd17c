import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { homedir, tmpdir } from "node:os";
import path from "node:path";
import { absoluteFilePath, absoluteRepoArgument } from "./local-paths.ts";

let cwd: string;

before(() => {
  cwd = mkdtempSync(path.join(tmpdir(), "llmgw-local-paths-"));
  writeFileSync(path.join(cwd, "tiny.gguf"), "GGUF");
});

after(() => rmSync(cwd, { recursive: true, force: true }));

test("a repo argument that names a local file or folder becomes absolute; repository ids and file: URLs stay", () => {
  assert.equal(absoluteRepoArgument("./models/x.gguf", cwd), path.join(cwd, "models", "x.gguf"));
  assert.equal(absoluteRepoArgument("../x", cwd), path.join(path.dirname(cwd), "x"));
  assert.equal(absoluteRepoArgument(".", cwd), cwd);
  assert.equal(absoluteRepoArgument("~/models", cwd), path.join(homedir(), "models"));
  assert.equal(absoluteRepoArgument("/srv/models", cwd), "/srv/models");
  assert.equal(absoluteRepoArgument("bartowski/Qwen2.5-7B-Instruct-GGUF", cwd), "bartowski/Qwen2.5-7B-Instruct-GGUF");
  assert.equal(absoluteRepoArgument("file:///srv/models/x.gguf", cwd), "file:///srv/models/x.gguf");
  // A bare name is never owner/name: one that exists here is a local file.
  assert.equal(absoluteRepoArgument("tiny.gguf", cwd), path.join(cwd, "tiny.gguf"));
  assert.equal(absoluteRepoArgument("absent.gguf", cwd), "absent.gguf", "left for the server to refuse as not owner/name");
});

test("a file argument is always local: relative to the folder given, ~ as the home", () => {
  assert.equal(absoluteFilePath("x.gguf", cwd), path.join(cwd, "x.gguf"));
  assert.equal(absoluteFilePath("models/x.gguf", cwd), path.join(cwd, "models", "x.gguf"));
  assert.equal(absoluteFilePath("~/x.gguf", cwd), path.join(homedir(), "x.gguf"));
  assert.equal(absoluteFilePath("/abs/x.gguf", cwd), "/abs/x.gguf");
});
