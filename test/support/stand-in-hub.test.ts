// The stand-in hub's wire behaviour, checked with raw HTTP, so the mirror and registry tests
// that rely on it rely on the Hub's real shapes (reference/protocols.md §1).
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { request } from "undici";
import { fakeCommitSha, startStandInHub, syntheticFile, type StandInHub } from "./stand-in-hub.ts";
import { APPROVED_TOKEN, GATED_REPO, GGUF_REPO, buildStandInRepos, type StandInRepos } from "./stand-in-repos.ts";

let hub: StandInHub;
let repos: StandInRepos;
const BIG_SIZE = 3 * 1024 * 1024 + 5;

before(async () => {
  repos = await buildStandInRepos();
  const big = await syntheticFile({ path: "big.bin", size: BIG_SIZE });
  hub = await startStandInHub({ repos: [...repos.all, { name: "llmgw-test/synthetic", files: [big] }] });
});

after(async () => {
  await hub.close();
});

function content(path: string): Buffer {
  const file = repos.gguf.files.find((f) => f.path === path);
  assert.ok(file !== undefined && Buffer.isBuffer(file.content));
  return file.content;
}

test("resolve of an LFS file redirects to the CDN with the commit, etag and size on the redirect", async () => {
  const bytes = content("tiny-llama-Q4_K_M.gguf");
  const response = await request(`${hub.url}/${GGUF_REPO}/resolve/main/tiny-llama-Q4_K_M.gguf`, { method: "HEAD" });
  assert.equal(response.statusCode, 302);
  assert.equal(response.headers["x-repo-commit"], fakeCommitSha(GGUF_REPO));
  assert.equal(response.headers["x-linked-etag"], `"${createHash("sha256").update(bytes).digest("hex")}"`);
  assert.equal(response.headers["x-linked-size"], String(bytes.length));
  const location = String(response.headers.location);
  assert.ok(location.startsWith(`${hub.cdnUrl}/cdn/repos/`), location);
  await response.body.dump();

  const full = await request(location);
  assert.equal(full.statusCode, 200);
  assert.deepEqual(Buffer.from(await full.body.arrayBuffer()), bytes);
  const suffix = await request(location, { headers: { range: "bytes=-4" } });
  assert.equal(suffix.statusCode, 206);
  assert.equal(suffix.headers["content-range"], `bytes ${bytes.length - 4}-${bytes.length - 1}/${bytes.length}`);
  assert.deepEqual(Buffer.from(await suffix.body.arrayBuffer()), bytes.subarray(bytes.length - 4));
  const beyond = await request(location, { headers: { range: `bytes=${bytes.length}-` } });
  assert.equal(beyond.statusCode, 416);
  await beyond.body.dump();
});

test("errors carry the Hub's X-Error-Code", async () => {
  const cases: [string, string | undefined, number, string][] = [
    [`/${GATED_REPO}/resolve/main/README.md`, undefined, 401, "GatedRepo"],
    [`/${GATED_REPO}/resolve/main/README.md`, "hf_other", 403, "GatedRepo"],
    [`/${GGUF_REPO}/resolve/main/nope.gguf`, undefined, 404, "EntryNotFound"],
    [`/${GGUF_REPO}/resolve/nope/README.md`, undefined, 404, "RevisionNotFound"],
    [`/api/models/${GGUF_REPO}/revision/nope`, undefined, 404, "RevisionNotFound"],
    ["/api/models/llmgw-test/missing", undefined, 401, "RepoNotFound"],
    ["/api/models/llmgw-test/missing", "hf_other", 404, "RepoNotFound"],
  ];
  for (const [path, token, status, code] of cases) {
    const response = await request(`${hub.url}${path}`, { headers: token === undefined ? {} : { authorization: `Bearer ${token}` } });
    assert.equal(response.statusCode, status, path);
    assert.equal(response.headers["x-error-code"], code, path);
    await response.body.dump();
  }
  const approved = await request(`${hub.url}/${GATED_REPO}/resolve/main/README.md`, { headers: { authorization: `Bearer ${APPROVED_TOKEN}` } });
  assert.equal(approved.statusCode, 200);
  await approved.body.dump();
  // A gated repository's metadata is public, as on the real Hub.
  const info = await request(`${hub.url}/api/models/${GATED_REPO}`);
  assert.equal(info.statusCode, 200);
  assert.equal(((await info.body.json()) as { gated: string }).gated, "manual");
});

test("model info with blobs=true carries sizes and LFS sha256", async () => {
  const response = await request(`${hub.url}/api/models/${GGUF_REPO}?blobs=true`);
  const body = (await response.body.json()) as { id: string; sha: string; siblings: { rfilename: string; size: number; lfs?: { sha256: string } }[] };
  assert.equal(body.id, GGUF_REPO);
  assert.equal(body.sha, fakeCommitSha(GGUF_REPO));
  const sibling = body.siblings.find((s) => s.rfilename === "tiny-llama-Q8_0.gguf");
  assert.equal(sibling?.lfs?.sha256, createHash("sha256").update(content("tiny-llama-Q8_0.gguf")).digest("hex"));
  assert.equal(body.siblings.find((s) => s.rfilename === "README.md")?.lfs, undefined);
});

test("a drop fault cuts a download after the given bytes", async () => {
  const response = await request(`${hub.url}/${GGUF_REPO}/resolve/main/tiny-llama-F16.gguf`, { method: "HEAD" });
  const location = String(response.headers.location);
  await response.body.dump();
  hub.setFault({ kind: "drop", afterBytes: 100, match: "/cdn/", times: 1 });
  try {
    const cut = await request(location);
    let received = 0;
    await assert.rejects(async () => {
      for await (const chunk of cut.body) received += (chunk as Buffer).length;
    });
    assert.equal(received, 100);
    // The fault was used once: the next attempt gets everything.
    const again = await request(location);
    assert.equal(Buffer.from(await again.body.arrayBuffer()).length, content("tiny-llama-F16.gguf").length);
  } finally {
    hub.setFault(null);
  }
});

test("a synthetic file is served by range without being held in memory, matching its sha256", async () => {
  const head = await request(`${hub.url}/llmgw-test/synthetic/resolve/main/big.bin`, { method: "HEAD" });
  const location = String(head.headers.location);
  const published = String(head.headers["x-linked-etag"]).replaceAll('"', "");
  assert.equal(head.headers["x-linked-size"], String(BIG_SIZE));
  await head.body.dump();
  const full = Buffer.from(await (await request(location)).body.arrayBuffer());
  assert.equal(full.length, BIG_SIZE);
  assert.equal(createHash("sha256").update(full).digest("hex"), published);
  // A range across the 1 MiB block boundary gives the same bytes as the full body.
  const start = 1024 * 1024 - 10;
  const ranged = await request(location, { headers: { range: `bytes=${start}-${start + 19}` } });
  assert.deepEqual(Buffer.from(await ranged.body.arrayBuffer()), full.subarray(start, start + 20));
});
