// Where `ctl` finds the admin key in a data dir: a missing admin.key and one that is there
// but cannot be read are told apart, since the advice differs (name the server's data dir,
// or run as the user that runs the server).
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { ADMIN_KEY_FILE } from "../core/data-dir.ts";
import { LlmgwError } from "../core/errors.ts";
import { AdminClient } from "./admin-client.ts";

let root: string;
const saved: Record<string, string | undefined> = {};

before(() => {
  root = mkdtempSync(path.join(tmpdir(), "llmgw-admin-client-"));
  // The key must come from the data dir, not from the environment the tests run in.
  for (const name of ["LLMGW_KEY", "LLMGW_SERVER", "LLMGW_DATA_DIR"]) {
    saved[name] = process.env[name];
    delete process.env[name];
  }
});

after(() => {
  rmSync(root, { recursive: true, force: true });
  for (const [name, value] of Object.entries(saved)) if (value !== undefined) process.env[name] = value;
});

function refusal(dataDir: string): LlmgwError {
  try {
    AdminClient.fromFlags({ dataDir, server: "http://127.0.0.1:1" });
  } catch (error) {
    assert.ok(error instanceof LlmgwError, String(error));
    return error;
  }
  return assert.fail("fromFlags found a key");
}

test("an admin.key that cannot be read says so and how to get past it, not that there is none", () => {
  // Tests run as root, which reads a chmod 000 file anyway; a directory in the file's place
  // fails to read (EISDIR) as a root-owned 0600 file does for another user (EACCES).
  const dataDir = path.join(root, "unreadable");
  mkdirSync(path.join(dataDir, ADMIN_KEY_FILE), { recursive: true });
  const error = refusal(dataDir);
  const file = path.join(dataDir, ADMIN_KEY_FILE);
  assert.equal(error.code, "admin_key_unreadable");
  assert.equal(
    error.message,
    `No admin key: ${file} exists but cannot be read (EISDIR). Run ctl as the user that runs the server, or pass the admin key with --key or LLMGW_KEY.`,
  );
  assert.doesNotMatch(error.message, /there is no|--data-dir/);
});

test("a data dir without admin.key names the file and the ways to give the server's data dir or key", () => {
  const dataDir = path.join(root, "empty");
  mkdirSync(dataDir);
  const error = refusal(dataDir);
  assert.equal(error.code, "missing_api_key");
  assert.match(error.message, new RegExp(`^No admin key: there is no ${path.join(dataDir, ADMIN_KEY_FILE).replace(/[.]/g, "\\.")} \\(data dir `));
  for (const named of ["--data-dir", "LLMGW_DATA_DIR", "--key", "LLMGW_KEY"]) assert.ok(error.message.includes(named), error.message);
});
