// The node's weight cache against the server's real mirror file handler
// (createMirrorFileHandler over a real Mirror on SQLite) on loopback, behind an authorize
// hook that stands for the server's node-credential check. The server wrapper counts
// requests and can drop a connection mid-file or hold a request, standing for a flaky or
// slow link between a node and the server.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { lstat, mkdir, mkdtemp, open, readFile, rm, symlink, writeFile } from "node:fs/promises";
import http, { type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { AuthenticationError, LlmgwError } from "../core/errors.ts";
import { createMirrorFileHandler, isMirrorFileRequest } from "../mirror/mirror-file-server.ts";
import { Mirror } from "../mirror/mirror.ts";
import { eventually } from "../../test/support/eventually.ts";
import { fileClockPast } from "../../test/support/fs-clock.ts";
import { openSqliteTestStore } from "../../test/support/stores.ts";
import { WeightCache, type CacheFileSpec, type CacheProgress } from "./weight-cache.ts";
import { WeightsIdentity } from "./weights-identity.ts";

const MODEL = "tiny-llama";
const VERSION = "0123456789ab";
const CREDENTIAL = "node-credential-for-tests";
const SINGLE = "tiny-llama-Q4_K_M.gguf";
const PARTS = ["Q2_K/tiny-llama-Q2_K-00001-of-00002.gguf", "Q2_K/tiny-llama-Q2_K-00002-of-00002.gguf"];

interface Seen {
  path: string;
  range: string | undefined;
  authorization: string | undefined;
}

/** The server's mirror file server on loopback, with the faults of a node's link. */
class MirrorServer {
  readonly requests: Seen[] = [];
  /** Drop the next whole-file answer after this many body bytes. */
  dropAfter: number | null = null;
  /** Hold every request until this settles. */
  gate: Promise<void> | null = null;
  #server: http.Server | null = null;
  url = "";

  constructor(private readonly mirror: Mirror) {}

  async start(): Promise<void> {
    const handler = createMirrorFileHandler({
      mirror: this.mirror,
      // Stands for the server's node-credential check.
      authorize: async (req) => {
        if (req.headers.authorization !== `Bearer ${CREDENTIAL}`)
          throw new AuthenticationError("This node credential is not valid; the node may have been removed.", { code: "invalid_node_credential" });
      },
    });
    this.#server = http.createServer((req, res) => void this.#serve(req, res, handler));
    await new Promise<void>((resolve) => this.#server?.listen(0, "127.0.0.1", resolve));
    this.url = `http://127.0.0.1:${(this.#server.address() as AddressInfo).port}`;
  }

  requestsFor(file: string): Seen[] {
    return this.requests.filter((seen) => seen.path.endsWith(`/${file}`));
  }

  async #serve(req: IncomingMessage, res: ServerResponse, handler: (req: IncomingMessage, res: ServerResponse) => Promise<void>): Promise<void> {
    this.requests.push({ path: decodeURIComponent(req.url ?? ""), range: req.headers.range, authorization: req.headers.authorization });
    if (this.gate !== null) await this.gate;
    if (this.dropAfter !== null && req.headers.range === undefined) {
      const limit = this.dropAfter;
      this.dropAfter = null;
      let sent = 0;
      const write = res.write.bind(res) as (chunk: Buffer, done?: () => void) => boolean;
      // Sends the first `limit` bytes, then cuts the connection once they left this side.
      res.write = ((chunk: Buffer) => {
        if (sent >= limit) return false;
        if (sent + chunk.length < limit) {
          sent += chunk.length;
          return write(chunk);
        }
        const head = chunk.subarray(0, limit - sent);
        sent = limit;
        write(head, () => res.socket?.destroy());
        return false;
      }) as typeof res.write;
    }
    if (isMirrorFileRequest(req.url)) await handler(req, res);
    else {
      res.writeHead(404);
      res.end();
    }
  }

  async close(): Promise<void> {
    this.#server?.closeAllConnections();
    await new Promise((resolve) => this.#server?.close(resolve));
  }
}

const dirs: string[] = [];
let cleanupStore: () => Promise<void>;
let mirror: Mirror;
let server: MirrorServer;
const published = new Map<string, { content: Buffer; spec: CacheFileSpec }>();

before(async () => {
  const dir = await tempDir();
  const opened = await openSqliteTestStore();
  cleanupStore = opened.cleanup;
  mirror = new Mirror({ store: opened.store, root: path.join(dir, "mirror"), retries: 0 });
  // The server's mirror holds one version: a single GGUF and a split one, copied from a local folder.
  const source = path.join(dir, "source");
  const sizes: Record<string, number> = { [SINGLE]: 3 * 1024 * 1024 + 17, [PARTS[0]!]: 400_000, [PARTS[1]!]: 250_001 };
  const files = [];
  for (const [file, size] of Object.entries(sizes)) {
    const content = randomBytes(size);
    const local = path.join(source, ...file.split("/"));
    await mkdir(path.dirname(local), { recursive: true });
    await writeFile(local, content);
    const sha256 = createHash("sha256").update(content).digest("hex");
    files.push({ path: file, url: pathToFileURL(local).href, sha256, size });
    published.set(file, { content, spec: { model: MODEL, version: VERSION, file, bytes: size, sha256 } });
  }
  const summary = await mirror.fetchVersion({ model: MODEL, version: VERSION, repo: pathToFileURL(source).href, revision: "local-revision", files });
  assert.equal(summary.complete, true);
  server = new MirrorServer(mirror);
  await server.start();
});

after(async () => {
  await server.close();
  await mirror.close();
  await cleanupStore();
  await Promise.all(dirs.map((dir) => rm(dir, { recursive: true, force: true })));
});

async function tempDir(): Promise<string> {
  const dir = await mkdtemp(path.join(tmpdir(), "llmgw-weight-cache-"));
  dirs.push(dir);
  return dir;
}

function spec(file: string): CacheFileSpec {
  const found = published.get(file);
  assert.ok(found, file);
  return found.spec;
}

/** A node's cache in a fresh folder, with its own identity memo. */
async function nodeCache(options: { credential?: string; freeBytes?: number } = {}): Promise<{ cache: WeightCache; identity: WeightsIdentity; root: string }> {
  const dir = await tempDir();
  const root = path.join(dir, "weights");
  const identity = new WeightsIdentity({ memoFile: path.join(dir, "weights-verified.json"), cacheRoot: root });
  const cache = new WeightCache({
    root,
    serverUrl: server.url,
    credential: () => options.credential ?? CREDENTIAL,
    identity,
    retries: 3,
    retryDelayMs: 1,
    progressIntervalMs: 0,
    ...(options.freeBytes === undefined ? {} : { io: { freeBytes: async () => options.freeBytes ?? null } }),
  });
  return { cache, identity, root };
}

async function failure(promise: Promise<unknown>): Promise<LlmgwError> {
  try {
    await promise;
  } catch (error) {
    assert.ok(error instanceof LlmgwError, `expected an LlmgwError, got ${String(error)}`);
    return error;
  }
  assert.fail("it succeeded");
}

describe("weight cache", () => {
  test("fetches the files with the node's credential into root/{model}/{version}/{file}, verified, and does not fetch them again", async () => {
    const { cache, identity, root } = await nodeCache();
    const before = server.requests.length;
    const progress: CacheProgress[] = [];
    try {
      const files = [spec(SINGLE), ...PARTS.map(spec)];
      const paths = await cache.ensure(files, { onProgress: (p) => progress.push(p) });
      assert.deepEqual(paths, [path.join(root, MODEL, VERSION, SINGLE), ...PARTS.map((part) => path.join(root, MODEL, VERSION, ...part.split("/")))]);
      // The split GGUF's parts sit side by side, as llama.cpp looks for them.
      assert.equal(path.dirname(paths[1]!), path.dirname(paths[2]!));
      for (const [index, file] of files.entries()) {
        assert.ok((await readFile(paths[index]!)).equals(published.get(file.file)!.content), file.file);
        assert.equal(existsSync(`${paths[index]!}.partial`), false);
      }
      const seen = server.requests.slice(before);
      assert.equal(seen.length, 3);
      assert.ok(seen.every((s) => s.authorization === `Bearer ${CREDENTIAL}` && s.range === undefined));
      assert.deepEqual(
        seen.map((s) => s.path),
        files.map((f) => `/mirror/${MODEL}/${VERSION}/${f.file}`),
      );
      const last = progress.filter((p) => p.file === SINGLE).at(-1);
      assert.deepEqual(last, { model: MODEL, version: VERSION, file: SINGLE, done: spec(SINGLE).bytes, total: spec(SINGLE).bytes });
      // The download hashed the bytes as they came: the identity check had nothing to read.
      assert.equal(identity.hashedCount(), 0);

      assert.deepEqual(await cache.ensure(files), paths);
      assert.equal(server.requests.length, before + 3, "nothing was fetched again");
      assert.equal(identity.hashedCount(), 0, "and nothing was read again");
      await identity.verify(files.map((file, index) => ({ path: paths[index]!, bytes: file.bytes, sha256: file.sha256 })));
      assert.equal(identity.hashedCount(), 0, "the check before the engine start reuses the stamps");

      assert.deepEqual(
        (await cache.list()).map((f) => [f.model, f.version, f.file, f.bytes]),
        [PARTS[0]!, PARTS[1]!, SINGLE].map((file) => [MODEL, VERSION, file, published.get(file)!.content.length]),
      );
      await cache.remove(MODEL, VERSION);
      assert.deepEqual(await cache.list(), []);
      assert.equal(existsSync(path.join(root, MODEL, VERSION)), false);
    } finally {
      await cache.close();
    }
  });

  test("replicas asking for the same file at once share one download", async () => {
    const { cache } = await nodeCache();
    const before = server.requestsFor(SINGLE).length;
    try {
      const [a, b, c] = await Promise.all([cache.ensure([spec(SINGLE)]), cache.ensure([spec(SINGLE)]), cache.ensure([spec(PARTS[0]!), spec(SINGLE)])]);
      assert.deepEqual(a, b);
      assert.equal(c[1], a[0]);
      assert.equal(server.requestsFor(SINGLE).length, before + 1);
      assert.ok((await readFile(a[0]!)).equals(published.get(SINGLE)!.content));
    } finally {
      await cache.close();
    }
  });

  test("a replica that gives up leaves the shared download to the others; when all give up it stops", async () => {
    const { cache, root } = await nodeCache();
    let release = (): void => undefined;
    server.gate = new Promise((resolve) => (release = resolve));
    const before = server.requestsFor(SINGLE).length;
    try {
      const quitter = new AbortController();
      const leaving = cache.ensure([spec(SINGLE)], { signal: quitter.signal });
      const staying = cache.ensure([spec(SINGLE)]);
      await eventually("the download to reach the server", () => server.requestsFor(SINGLE).length === before + 1);
      quitter.abort(new Error("replica stopped"));
      await assert.rejects(leaving, /replica stopped/);
      release();
      server.gate = null;
      const [file] = await staying;
      assert.ok((await readFile(file!)).equals(published.get(SINGLE)!.content));
      assert.equal(server.requestsFor(SINGLE).length, before + 1);

      // Now the only caller gives up: the download stops, and the next ensure fetches anew.
      server.gate = new Promise((resolve) => (release = resolve));
      const partBefore = server.requestsFor(PARTS[1]!).length;
      const only = new AbortController();
      const alone = cache.ensure([spec(PARTS[1]!)], { signal: only.signal });
      await eventually("the second download to reach the server", () => server.requestsFor(PARTS[1]!).length === partBefore + 1);
      only.abort(new Error("model removed"));
      await assert.rejects(alone, /model removed/);
      assert.equal(existsSync(path.join(root, MODEL, VERSION, ...PARTS[1]!.split("/"))), false);
      release();
      server.gate = null;
      const [again] = await cache.ensure([spec(PARTS[1]!)]);
      assert.equal(server.requestsFor(PARTS[1]!).length, partBefore + 2, "the abandoned download was stopped, and a new one fetched the file");
      assert.ok((await readFile(again!)).equals(published.get(PARTS[1]!)!.content));
    } finally {
      release();
      server.gate = null;
      await cache.close();
    }
  });

  test("a connection dropped mid-file is resumed with Range from the bytes on disk", async () => {
    const { cache } = await nodeCache();
    const before = server.requestsFor(SINGLE).length;
    server.dropAfter = 700_000;
    try {
      const [file] = await cache.ensure([spec(SINGLE)]);
      const seen = server.requestsFor(SINGLE).slice(before);
      assert.deepEqual(
        seen.map((s) => s.range),
        [undefined, "bytes=700000-"],
      );
      assert.ok(seen.every((s) => s.authorization === `Bearer ${CREDENTIAL}`));
      assert.ok((await readFile(file!)).equals(published.get(SINGLE)!.content));
    } finally {
      server.dropAfter = null;
      await cache.close();
    }
  });

  test("bytes that do not match the published sha256 are refused with both hashes, and nothing lands in the cache", async () => {
    const { cache, root } = await nodeCache();
    const wrong = createHash("sha256").update("not these bytes").digest("hex");
    const good = spec(PARTS[1]!);
    try {
      const error = await failure(cache.ensure([{ ...good, sha256: wrong }]));
      assert.equal(error.code, "weights_download_mismatch");
      assert.match(error.message, new RegExp(`has sha256 ${good.sha256}, but the server published ${wrong}`));
      const final = path.join(root, MODEL, VERSION, ...good.file.split("/"));
      assert.equal(existsSync(final), false);
      assert.equal(existsSync(`${final}.partial`), false);
    } finally {
      await cache.close();
    }
  });

  test("a refused credential, a file the mirror does not have, a full disk and a bad name each fail clearly", async () => {
    const { cache: refused } = await nodeCache({ credential: "stale-credential" });
    const { cache: full, root: fullRoot } = await nodeCache({ freeBytes: 1000 });
    const { cache } = await nodeCache();
    try {
      // Stands for a statfs that reports 1000 bytes free.
      const noRoom = await failure(full.ensure([spec(SINGLE)]));
      assert.equal(noRoom.code, "weights_disk_full");
      assert.equal(noRoom.status, 507);
      assert.match(
        noRoom.message,
        new RegExp(
          `This node's disk is full: tiny-llama/0123456789ab/tiny-llama-Q4_K_M\\.gguf \\(${spec(SINGLE).bytes} bytes\\) does not fit in its weight cache \\(${fullRoot}\\)`,
        ),
      );

      const denied = await failure(refused.ensure([spec(SINGLE)]));
      assert.equal(denied.code, "node_credential_refused");
      assert.match(
        denied.message,
        /refused this node's credential \(401\) when fetching tiny-llama\/0123456789ab\/tiny-llama-Q4_K_M\.gguf: This node credential is not valid/,
      );
      assert.match(denied.message, /re-join it with 'llmgw agent --server URL --join-token TOKEN'/);
      assert.equal(server.requests.at(-1)?.authorization, "Bearer stale-credential");

      const before = server.requests.length;
      const gone = await failure(cache.ensure([{ ...spec(SINGLE), version: "fedcba987654" }]));
      assert.equal(gone.code, "weights_not_on_server");
      assert.match(gone.message, /no longer has tiny-llama\/fedcba987654\/tiny-llama-Q4_K_M\.gguf \(404\): The mirror has no complete file/);
      assert.equal(server.requests.length, before + 1, "a 404 is not retried");

      for (const bad of [{ model: ".." }, { version: "a/b" }, { file: "../../etc/passwd" }, { file: "x.gguf.partial" }]) {
        const error = await failure(cache.ensure([{ ...spec(SINGLE), ...bad }]));
        assert.equal(error.code, "invalid_path", JSON.stringify(bad));
      }
      assert.equal(server.requests.length, before + 1, "bad names never reach the server");
    } finally {
      await full.close();
      await refused.close();
      await cache.close();
    }
  });

  test("a cached file changed on this node fails the identity check and is fetched again; so is a link put in its place", async () => {
    const { cache, identity } = await nodeCache();
    const wanted = spec(PARTS[0]!);
    const content = published.get(PARTS[0]!)!.content;
    try {
      const [file] = await cache.ensure([wanted]);
      const before = server.requestsFor(PARTS[0]!).length;

      // A byte changed in place (same size), in a later tick of the file system's clock than the download's stamp.
      await fileClockPast(await tempDir(), (await lstat(file!, { bigint: true })).ctimeNs);
      const handle = await open(file!, "r+");
      await handle.write(Buffer.from([content[100]! ^ 0xff]), 0, 1, 100);
      await handle.close();
      await identity.verify([{ path: file!, bytes: wanted.bytes, sha256: wanted.sha256 }]).then(
        () => assert.fail("the identity check passed a changed file"),
        (error: LlmgwError) => {
          assert.equal(error.code, "weights_sha256_mismatch");
          assert.match(error.message, /in this node's weight cache: the agent removes it and fetches it again/);
        },
      );
      assert.deepEqual(await cache.ensure([wanted]), [file]);
      assert.equal(server.requestsFor(PARTS[0]!).length, before + 1, "fetched again");
      assert.ok((await readFile(file!)).equals(content));

      // A link to a copy elsewhere, with the right bytes: refused all the same, and replaced by the file.
      const elsewhere = path.join(await tempDir(), "copy.gguf");
      await writeFile(elsewhere, content);
      await rm(file!);
      await symlink(elsewhere, file!);
      await cache.ensure([wanted]);
      assert.equal(server.requestsFor(PARTS[0]!).length, before + 2);
      assert.ok((await lstat(file!)).isFile());
      assert.ok((await readFile(elsewhere)).equals(content), "the link's target was left alone");
      await identity.verify([{ path: file!, bytes: wanted.bytes, sha256: wanted.sha256 }]);
    } finally {
      await cache.close();
    }
  });
});
