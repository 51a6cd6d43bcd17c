// A test whose outside program is missing must say which program and how to install it,
// never fail later with `spawn ... ENOENT`.
import { test } from "node:test";
import assert from "node:assert/strict";
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { findTool, HAPROXY, type OutsideTool } from "./tools.ts";

test("a missing tool is named, with the command that installs it", () => {
  const empty = mkdtempSync(path.join(tmpdir(), "llmgw-tools-"));
  try {
    assert.throws(
      () => findTool(HAPROXY, { PATH: empty }, []),
      (error: Error) => {
        assert.match(error.message, /^HAProxy is not installed \(looked for haproxy on PATH\)/);
        assert.match(error.message, /apt-get install -y haproxy/);
        assert.doesNotMatch(error.message, /ENOENT/);
        return true;
      },
    );
  } finally {
    rmSync(empty, { recursive: true, force: true });
  }
});

test("a tool is found on PATH, and an environment variable naming it wins", () => {
  const dir = mkdtempSync(path.join(tmpdir(), "llmgw-tools-"));
  try {
    const onPath = path.join(dir, "fake-tool");
    writeFileSync(onPath, "#!/bin/sh\n");
    chmodSync(onPath, 0o755);
    const named = path.join(dir, "named-tool");
    writeFileSync(named, "#!/bin/sh\n");
    chmodSync(named, 0o755);
    const notExecutable = path.join(dir, "plain-file");
    writeFileSync(notExecutable, "");
    const tool: OutsideTool = { name: "Fake", candidates: ["fake-tool"], debianPackage: "fake", envVariable: "FAKE_PATH" };
    assert.equal(findTool(tool, { PATH: `/nonexistent:${dir}` }), onPath);
    // Not on PATH, but in a system folder (Debian's /usr/sbin for haproxy): found there.
    assert.equal(findTool(tool, { PATH: "/nonexistent" }, [dir]), onPath);
    assert.equal(findTool(tool, { PATH: dir, FAKE_PATH: named }), named);
    // A file that cannot be run is not the tool.
    const plain: OutsideTool = { name: "Plain", candidates: [notExecutable], debianPackage: "plain", envVariable: "PLAIN_PATH" };
    assert.throws(() => findTool(plain, { PATH: dir }), /Plain is not installed \(looked for .*plain-file\).*apt-get install -y plain, or set PLAIN_PATH/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
