// HubClient against the stand-in hub (test/support/stand-in-hub.ts) over real HTTP on
// loopback. The stand-in stands for huggingface.co's API: model info, the paginated tree
// listing, resolve redirects with X-Repo-Commit / X-Linked-* headers, and its 401/403/404
// answers with X-Error-Code (see the comment at the top of the stand-in).
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { inspect } from "node:util";
import { request } from "undici";
import { BadRequestError, LlmgwError, NotFoundError, PermissionDeniedError, UpstreamError } from "../core/errors.ts";
import { fakeCommitSha, startStandInHub, type StandInHub } from "../../test/support/stand-in-hub.ts";
import {
  APPROVED_TOKEN,
  GATED_REPO,
  GGUF_REPO,
  PRIVATE_REPO,
  SAFETENSORS_REPO,
  buildStandInRepos,
  type StandInRepos,
} from "../../test/support/stand-in-repos.ts";
import { HubClient, gitBlobId, headersForRedirect, nextLink, resolveRegistryEndpoint, resolveRegistryToken, type HubClientOptions } from "./hub-client.ts";

let hub: StandInHub;
let repos: StandInRepos;
const clients: HubClient[] = [];

function client(options: Partial<HubClientOptions> = {}): HubClient {
  const made = new HubClient({ endpoint: hub.url, retries: 0, retryDelayMs: 10, ...options });
  clients.push(made);
  return made;
}

function isError(type: new (...args: never[]) => LlmgwError, code: string, ...mentions: (string | RegExp)[]) {
  return (error: unknown): boolean => {
    assert.ok(error instanceof type, `expected ${type.name}, got ${String(error)}`);
    assert.equal(error.code, code);
    for (const mention of mentions) {
      if (typeof mention === "string") assert.ok(error.message.includes(mention), `message should mention '${mention}': ${error.message}`);
      else assert.match(error.message, mention);
    }
    return true;
  };
}

before(async () => {
  repos = await buildStandInRepos();
  // Three entries a page, so every repository takes several pages of the tree listing.
  hub = await startStandInHub({ repos: repos.all, pageSize: 3 });
});

after(async () => {
  await Promise.all(clients.map((c) => c.close()));
  await hub.close();
});

describe("repoInfo", () => {
  test("reads sha, gating and every file of a repository, following the tree listing's pages", async () => {
    hub.requests.length = 0;
    const info = await client().repoInfo({ repo: GGUF_REPO });
    assert.equal(info.repo, GGUF_REPO);
    assert.equal(info.revision, "main");
    assert.equal(info.sha, fakeCommitSha(GGUF_REPO));
    assert.equal(info.shortSha, info.sha.slice(0, 12));
    assert.equal(info.gated, false);
    assert.equal(info.private, false);
    assert.deepEqual(
      info.files.map((f) => f.path),
      repos.gguf.files.map((f) => f.path).sort(),
    );
    for (const file of info.files) {
      const source = repos.gguf.files.find((f) => f.path === file.path);
      assert.ok(source !== undefined && Buffer.isBuffer(source.content));
      assert.equal(file.size, source.content.length, file.path);
      const sha256 = createHash("sha256").update(source.content).digest("hex");
      if (file.path.endsWith(".gguf")) {
        // LFS files carry the sha256 as the tree entry's lfs.oid.
        assert.equal(file.sha256, sha256, file.path);
      } else {
        // Small files live in git: no sha256 from the Hub, but the git blob id.
        assert.equal(file.sha256, null, file.path);
        assert.equal(file.blobId, gitBlobId(source.content), file.path);
      }
    }
    const treeRequests = hub.requests.filter((r) => r.path.includes("/tree/"));
    assert.ok(treeRequests.length >= 3, `expected several tree pages, got ${treeRequests.length}`);
    assert.ok(
      treeRequests.every((r) => r.path.endsWith(`/tree/${info.sha}`)),
      "the listing is pinned to the commit sha",
    );
    assert.ok(
      treeRequests.slice(1).every((r) => r.url.includes("cursor=")),
      "later pages come from the Link header",
    );
    assert.ok(treeRequests.every((r) => r.url.includes("recursive=true")));
  });

  test("a revision by tag or full sha lists the files of that commit", async () => {
    const c = client();
    const tagged = await c.repoInfo({ repo: GGUF_REPO, revision: "v1.0" });
    assert.equal(tagged.revision, "v1.0");
    assert.equal(tagged.sha, fakeCommitSha(`${GGUF_REPO}@v1.0`));
    assert.deepEqual(
      tagged.files.map((f) => f.path),
      [".gitattributes", "README.md", "tiny-llama-Q8_0.gguf"],
    );
    const bySha = await c.repoInfo({ repo: GGUF_REPO, revision: tagged.sha });
    assert.deepEqual(bySha.files, tagged.files);
  });

  test("a safetensors repository lists shards, index and companions", async () => {
    const info = await client().repoInfo({ repo: SAFETENSORS_REPO });
    const paths = info.files.map((f) => f.path);
    for (const path of [
      "config.json",
      "model.safetensors.index.json",
      "model-00001-of-00002.safetensors",
      "model-00002-of-00002.safetensors",
      "tokenizer.json",
    ]) {
      assert.ok(paths.includes(path), path);
    }
    assert.match(info.files.find((f) => f.path === "model-00001-of-00002.safetensors")?.sha256 ?? "", /^[0-9a-f]{64}$/);
  });

  test("a gated repository without a token fails naming HF_TOKEN and the repository", async () => {
    await assert.rejects(client().repoInfo({ repo: GATED_REPO }), isError(PermissionDeniedError, "gated_repo", "HF_TOKEN", GATED_REPO, "no HF_TOKEN is set"));
  });

  test("a gated repository with a token that is not approved fails the same way", async () => {
    await assert.rejects(
      client({ token: "hf_not_approved" }).repoInfo({ repo: GATED_REPO }),
      isError(PermissionDeniedError, "gated_repo", "HF_TOKEN", GATED_REPO, "not on its approved list"),
    );
  });

  test("inside the server, the token messages say it belongs in the server's environment, not ctl's", async () => {
    const where = "in the environment of the llmgw server (not of ctl) and restart it";
    await assert.rejects(
      client({ inServer: true }).repoInfo({ repo: GATED_REPO }),
      isError(PermissionDeniedError, "gated_repo", GATED_REPO, "no HF_TOKEN is set in the llmgw server's environment", where),
    );
    await assert.rejects(
      client({ inServer: true, token: "hf_not_approved" }).repoInfo({ repo: GATED_REPO }),
      isError(PermissionDeniedError, "gated_repo", "the llmgw server's HF_TOKEN is not on its approved list", where),
    );
    await assert.rejects(client({ inServer: true }).repoInfo({ repo: PRIVATE_REPO }), isError(NotFoundError, "repo_not_found", PRIVATE_REPO, where));
    // A client outside a server (a script, a test) does not send anyone to a server.
    await assert.rejects(
      client().repoInfo({ repo: GATED_REPO }),
      (error: unknown) => error instanceof PermissionDeniedError && !/llmgw server/.test(error.message),
    );
  });

  test("a gated repository with an approved token is read, and the token went only to the hub", async () => {
    hub.requests.length = 0;
    const info = await client({ token: APPROVED_TOKEN }).repoInfo({ repo: GATED_REPO });
    assert.equal(info.gated, "manual");
    assert.ok(info.files.length > 0);
    // The access check is a HEAD of the resolve URL, answered by the redirect itself.
    const head = hub.requests.find((r) => r.method === "HEAD");
    assert.ok(head !== undefined, "a HEAD request was made");
    assert.ok(head.path.includes("/resolve/"));
    assert.equal(head.authorization, `Bearer ${APPROVED_TOKEN}`);
    assert.ok(
      hub.requests.every((r) => !r.path.startsWith("/cdn/")),
      "metadata does not follow the CDN redirect",
    );
  });

  test("a private repository is 'not found or private' without a token, and readable with one", async () => {
    await assert.rejects(client().repoInfo({ repo: PRIVATE_REPO }), isError(NotFoundError, "repo_not_found", PRIVATE_REPO, "private", "HF_TOKEN"));
    const info = await client({ token: APPROVED_TOKEN }).repoInfo({ repo: PRIVATE_REPO });
    assert.equal(info.private, true);
  });

  test("an unknown repository is a not-found error naming it, with or without a token", async () => {
    await assert.rejects(client().repoInfo({ repo: "llmgw-test/no-such-repo" }), isError(NotFoundError, "repo_not_found", "llmgw-test/no-such-repo"));
    await assert.rejects(
      client({ token: "hf_any" }).repoInfo({ repo: "llmgw-test/no-such-repo" }),
      (error: unknown) => isError(NotFoundError, "repo_not_found", "llmgw-test/no-such-repo")(error) && (error as NotFoundError).status === 404,
    );
  });

  test("a token the registry does not accept is named as the problem", async () => {
    const strict = await startStandInHub({ repos: [repos.gguf], validTokens: [APPROVED_TOKEN] });
    try {
      await assert.rejects(
        client({ endpoint: strict.url, token: "hf_revoked" }).repoInfo({ repo: GGUF_REPO }),
        isError(PermissionDeniedError, "registry_token_rejected", "HF_TOKEN", "Invalid credentials"),
      );
      await assert.rejects(
        client({ endpoint: strict.url, token: "hf_revoked", inServer: true }).repoInfo({ repo: GGUF_REPO }),
        isError(PermissionDeniedError, "registry_token_rejected", "the llmgw server's HF_TOKEN", "restart the llmgw server"),
      );
    } finally {
      await strict.close();
    }
  });

  test("an unknown revision is a not-found error naming the revision and repository", async () => {
    await assert.rejects(
      client().repoInfo({ repo: GGUF_REPO, revision: "no-such-branch" }),
      isError(NotFoundError, "revision_not_found", "'no-such-branch'", GGUF_REPO),
    );
  });

  test("a listing with a path the mirror could not store (a segment over 255 bytes) is refused naming it", async () => {
    const name = "llmgw-test/long-names";
    hub.putRepo({ name, files: [{ path: `${"d".repeat(256)}/m-Q4_K_M.gguf`, content: Buffer.from("GGUF") }] });
    try {
      await assert.rejects(client().repoInfo({ repo: name }), isError(UpstreamError, "registry_bad_response", name, "longer than 255 bytes"));
    } finally {
      hub.removeRepo(name);
    }
  });

  test("names that are not owner/name are refused before any request", async () => {
    hub.requests.length = 0;
    for (const bad of ["just-a-name", "a/b/c", "../etc", "owner/..", "owner/na me", "-owner/name", "owner/name.", "own--er/name", "", "owner/"]) {
      await assert.rejects(client().repoInfo({ repo: bad }), isError(BadRequestError, "invalid_repo_name", `'${bad}'`), bad);
    }
    await assert.rejects(client().repoInfo({ repo: GGUF_REPO, revision: "" }), isError(BadRequestError, "invalid_revision"));
    assert.equal(hub.requests.length, 0);
  });
});

describe("failures of the registry", () => {
  test("a registry that does not answer in time is a retryable error naming the endpoint", async () => {
    hub.setFault({ kind: "delay", ms: 5_000, match: "/api/" });
    try {
      await assert.rejects(
        client({ headersTimeoutMs: 150 }).repoInfo({ repo: GGUF_REPO }),
        (error: unknown) => isError(UpstreamError, "registry_timeout", hub.url, "150 ms")(error) && (error as UpstreamError).retryable,
      );
    } finally {
      hub.setFault(null);
    }
  });

  test("a dropped connection is a retryable error naming the endpoint, and a retry succeeds", async () => {
    hub.setFault({ kind: "drop", afterBytes: 20, match: /\/tree\// });
    try {
      await assert.rejects(
        client().repoInfo({ repo: GGUF_REPO }),
        (error: unknown) => isError(UpstreamError, "registry_unreachable", hub.url)(error) && (error as UpstreamError).retryable,
      );
      hub.setFault({ kind: "drop", afterBytes: 20, match: /\/tree\//, times: 1 });
      hub.requests.length = 0;
      const info = await client({ retries: 1 }).repoInfo({ repo: GGUF_REPO });
      assert.equal(info.files.length, repos.gguf.files.length);
      const firstPages = hub.requests.filter((r) => r.path.includes("/tree/") && !r.url.includes("cursor="));
      assert.equal(firstPages.length, 2, "the first page was fetched again after the drop");
    } finally {
      hub.setFault(null);
    }
  });

  test("a reset before any answer and a 503 are retryable", async () => {
    hub.setFault({ kind: "reset", match: "/api/" });
    try {
      await assert.rejects(client().repoInfo({ repo: GGUF_REPO }), isError(UpstreamError, "registry_unreachable", hub.url));
      hub.setFault({ kind: "status", status: 503, match: "/api/" });
      await assert.rejects(
        client().repoInfo({ repo: GGUF_REPO }),
        (error: unknown) => isError(UpstreamError, "registry_error", "503")(error) && (error as UpstreamError).retryable,
      );
    } finally {
      hub.setFault(null);
    }
  });

  test("an aborted read stops at once with the caller's reason, not a registry error", async () => {
    hub.setFault({ kind: "hang", match: "/api/" });
    try {
      const controller = new AbortController();
      setTimeout(() => controller.abort(new Error("client went away")), 50);
      await assert.rejects(client({ retries: 2 }).repoInfo({ repo: GGUF_REPO, signal: controller.signal }), (error: unknown) => {
        assert.ok(!(error instanceof LlmgwError), String(error));
        return true;
      });
    } finally {
      hub.setFault(null);
    }
  });

  test("a registry that refuses connections is a retryable error naming it", async () => {
    const closed = await startStandInHub({ repos: [] });
    await closed.close();
    await assert.rejects(
      client({ endpoint: closed.url }).repoInfo({ repo: GGUF_REPO }),
      (error: unknown) => isError(UpstreamError, "registry_unreachable", closed.url)(error) && (error as UpstreamError).retryable,
    );
  });

  test("an answer that is not the Hub's shape is a clear error", async () => {
    hub.setFault({ kind: "status", status: 200, match: "/api/", headers: { "content-type": "application/json" }, body: JSON.stringify({ hello: "world" }) });
    try {
      await assert.rejects(client().repoInfo({ repo: GGUF_REPO }), isError(UpstreamError, "registry_bad_response", "sha"));
    } finally {
      hub.setFault(null);
    }
  });
});

describe("downloads", () => {
  test("downloadUrl pins the commit and encodes each path segment", () => {
    const c = client();
    const sha = fakeCommitSha(GGUF_REPO);
    assert.equal(c.downloadUrl(GGUF_REPO, sha, "Q2_K/a b#c.gguf"), `${hub.url}/${GGUF_REPO}/resolve/${sha}/Q2_K/a%20b%23c.gguf`);
    assert.throws(() => c.downloadUrl(GGUF_REPO, sha, "../secret"), isError(BadRequestError, "invalid_path"));
    assert.throws(() => c.downloadUrl(GGUF_REPO, sha, "/etc/passwd"), isError(BadRequestError, "invalid_path"));
  });

  test("the token goes only to the registry's origin, never to the CDN, and never into logs", () => {
    const c = client({ token: "hf_secret_value" });
    assert.equal(c.requestHeaders(`${hub.url}/x`).authorization, "Bearer hf_secret_value");
    assert.equal(c.requestHeaders(`${hub.cdnUrl}/cdn/repos/abc`).authorization, undefined);
    assert.equal(client().requestHeaders(`${hub.url}/x`).authorization, undefined);
    const headers = { authorization: "Bearer t", range: "bytes=0-1" };
    assert.deepEqual(headersForRedirect(headers, `${hub.url}/a`, `${hub.cdnUrl}/b`), { range: "bytes=0-1" });
    assert.deepEqual(headersForRedirect(headers, `${hub.url}/a`, `${hub.url}/b`), headers);
    assert.doesNotMatch(inspect(c, { depth: 5 }), /hf_secret_value/);
    assert.doesNotMatch(JSON.stringify({ ...c }), /hf_secret_value/);
  });

  test("fileMetadata reads the resolve redirect's headers; the CDN serves ranges", async () => {
    const c = client();
    const sha = fakeCommitSha(GGUF_REPO);
    const info = await c.repoInfo({ repo: GGUF_REPO });
    const lfs = info.files.find((f) => f.path === "tiny-llama-Q4_K_M.gguf");
    assert.ok(lfs !== undefined);
    const meta = await c.fileMetadata({ repo: GGUF_REPO, revision: "main", path: lfs.path });
    assert.equal(meta.commit, sha);
    assert.equal(meta.etag, lfs.sha256);
    assert.equal(meta.size, lfs.size);
    assert.ok(meta.location.startsWith(`${hub.cdnUrl}/cdn/`), meta.location);

    const ranged = await request(meta.location, { headers: { range: "bytes=0-3" } });
    assert.equal(ranged.statusCode, 206);
    assert.equal(ranged.headers["content-range"], `bytes 0-3/${lfs.size}`);
    assert.equal(await ranged.body.text(), "GGUF");

    const small = info.files.find((f) => f.path === "README.md");
    assert.ok(small !== undefined);
    const smallMeta = await c.fileMetadata({ repo: GGUF_REPO, revision: sha, path: "README.md" });
    assert.equal(smallMeta.etag, small.blobId);
    assert.equal(smallMeta.size, small.size);

    await assert.rejects(c.fileMetadata({ repo: GGUF_REPO, revision: sha, path: "nope.gguf" }), isError(NotFoundError, "entry_not_found", "nope.gguf"));
  });

  test("readSmallFile reads a git file and an LFS file through the CDN, the token only on the registry", async () => {
    const c = client({ token: APPROVED_TOKEN });
    const info = await c.repoInfo({ repo: SAFETENSORS_REPO });
    const config = repos.safetensors.files.find((f) => f.path === "config.json");
    assert.ok(config !== undefined && Buffer.isBuffer(config.content));
    assert.deepEqual(await c.readSmallFile({ repo: SAFETENSORS_REPO, sha: info.sha, path: "config.json", maxBytes: 1024 * 1024 }), config.content);

    const since = hub.requests.length;
    const gguf = await c.repoInfo({ repo: GGUF_REPO });
    const q4 = gguf.files.find((f) => f.path === "tiny-llama-Q4_K_M.gguf");
    assert.ok(q4 !== undefined);
    const bytes = await c.readSmallFile({ repo: GGUF_REPO, sha: gguf.sha, path: q4.path, maxBytes: 1024 * 1024 });
    assert.equal(createHash("sha256").update(bytes).digest("hex"), q4.sha256);
    const reads = hub.requests.slice(since).filter((r) => r.path.includes("/resolve/") || r.path.startsWith("/cdn/"));
    assert.deepEqual(
      reads.map((r) => [r.path.startsWith("/cdn/") ? "cdn" : "resolve", r.authorization]),
      [
        ["resolve", `Bearer ${APPROVED_TOKEN}`],
        ["cdn", undefined],
      ],
    );
  });

  test("readSmallFile refuses a file over its cap, announced or not, and maps the Hub's errors", async () => {
    const c = client();
    const sha = fakeCommitSha(GGUF_REPO);
    const path = "tiny-llama-Q4_K_M.gguf";
    await assert.rejects(
      c.readSmallFile({ repo: GGUF_REPO, sha, path, maxBytes: 1000 }),
      isError(BadRequestError, "file_too_large", path, "640 KiB, more than 1000 B"),
    );
    // Without Content-Length the bytes are counted as they arrive.
    hub.setFault({ kind: "chunked", match: "/cdn/" });
    try {
      await assert.rejects(
        c.readSmallFile({ repo: GGUF_REPO, sha, path, maxBytes: 1000 }),
        isError(BadRequestError, "file_too_large", path, "larger than 1000 B"),
      );
    } finally {
      hub.setFault(null);
    }
    await assert.rejects(c.readSmallFile({ repo: GGUF_REPO, sha, path: "nope.json", maxBytes: 1000 }), isError(NotFoundError, "entry_not_found", "nope.json"));
    await assert.rejects(
      c.readSmallFile({ repo: GATED_REPO, sha: fakeCommitSha(GATED_REPO), path: "README.md", maxBytes: 1000 }),
      isError(PermissionDeniedError, "gated_repo", "HF_TOKEN", GATED_REPO),
    );
  });

  test("the corrupt fault serves bytes that do not match the published sha256", async () => {
    const c = client();
    const info = await c.repoInfo({ repo: GGUF_REPO });
    const file = info.files.find((f) => f.path === "tiny-llama-Q8_0.gguf");
    assert.ok(file !== undefined);
    const meta = await c.fileMetadata({ repo: GGUF_REPO, revision: info.sha, path: file.path });
    hub.setFault({ kind: "corrupt", match: "/cdn/" });
    try {
      const response = await request(meta.location);
      const body = Buffer.from(await response.body.arrayBuffer());
      assert.equal(body.length, file.size);
      assert.notEqual(createHash("sha256").update(body).digest("hex"), file.sha256);
    } finally {
      hub.setFault(null);
    }
  });
});

describe("configuration", () => {
  test("the endpoint comes from the flag, then HF_ENDPOINT, then huggingface.co, without trailing slashes", () => {
    assert.equal(resolveRegistryEndpoint({ flag: "http://flag.example/", env: { HF_ENDPOINT: "http://env.example" } }), "http://flag.example");
    assert.equal(resolveRegistryEndpoint({ env: { HF_ENDPOINT: "https://hf-mirror.example//" } }), "https://hf-mirror.example");
    assert.equal(resolveRegistryEndpoint({ env: {} }), "https://huggingface.co");
    assert.throws(() => resolveRegistryEndpoint({ flag: "ftp://x", env: {} }), isError(BadRequestError, "invalid_registry_endpoint", "ftp://x", "--registry"));
    assert.throws(() => resolveRegistryEndpoint({ env: { HF_ENDPOINT: "not a url" } }), isError(BadRequestError, "invalid_registry_endpoint", "HF_ENDPOINT"));
  });

  test("the token comes from HF_TOKEN", () => {
    assert.equal(resolveRegistryToken({ HF_TOKEN: " hf_abc " }), "hf_abc");
    assert.equal(resolveRegistryToken({ HF_TOKEN: "" }), undefined);
    assert.equal(resolveRegistryToken({}), undefined);
  });

  test("nextLink finds rel=next among other links", () => {
    const base = "http://hub.example/api/models/a/b/tree/main";
    assert.equal(nextLink('<http://hub.example/p2?cursor=x>; rel="next"', base), "http://hub.example/p2?cursor=x");
    assert.equal(nextLink('</p1>; rel="prev", </p3?c=1>; rel="next"', base), "http://hub.example/p3?c=1");
    assert.equal(nextLink("<http://hub.example/p2>; rel=next", base), "http://hub.example/p2");
    assert.equal(nextLink('<http://hub.example/p1>; rel="prev"', base), undefined);
    assert.equal(nextLink(undefined, base), undefined);
  });
});
