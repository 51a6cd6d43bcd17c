// Every secret llmgw keeps, looked for where it rests (issue 25), on SQLite and on
// PostgreSQL: a real `llmgw up --demo` child process (the bundled llama.cpp engine on a
// generated GGUF, so a replica with an engine key runs) is given an admin key, client keys
// (one replaced by another and revoked: llmgw has no in-place rotation), an external model
// whose key a stand-in OpenAI-compatible server on loopback demands (one request goes
// through it), a webhook channel whose URL carries tokens and whose signing secret a
// Standard Webhooks receiver checks, and on PostgreSQL the cluster secret. Then everything
// at rest is read: the SQLite files (with -wal) or every row of every table of the test's
// PostgreSQL database as text, every file under the data dir, the server's stdout and
// stderr (at debug level), and what the admin API and `ctl model show` answer. No secret's
// plain value may appear there; keys are stored hashed, and a hash is not the secret.
//
// By design three files hold one secret each, mode 0600, for the operator on this machine:
// DATA_DIR/admin.key (the first admin key, which `up` also prints once), DATA_DIR/join.token
// (the join token, `ctl node join-token`) and DATA_DIR/agent/node.json (the local node's
// credential). Each is checked to hold its own secret and no other.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import pg from "pg";
import { findFreePort } from "../src/agent/free-port.ts";
import { createTestDatabase, spawnLlmgw, stopAll, type LlmgwProcess } from "./support/cluster-processes.ts";
import { eventually } from "./support/eventually.ts";
import { startFakeUpstream } from "./support/fake-upstream.ts";
import { postgresSchemaOrSkip } from "./support/stores.ts";
import { startReceiver } from "./support/webhook-receiver.ts";

const BIN = fileURLToPath(new URL("../bin/llmgw.js", import.meta.url));
/** Files that hold one secret by design (see the top of this file), by path under the data dir. */
const CREDENTIAL_FILES: Record<string, string> = { "admin.key": "first admin key", "join.token": "join token", "agent/node.json": "node credential" };
const MODEL = "visible-external-model";

type Secrets = Record<string, string>;

/** The secrets whose plain value occurs in `text`, by name. */
function found(text: Buffer | string, secrets: Secrets): string[] {
  const haystack = typeof text === "string" ? Buffer.from(text) : text;
  return Object.entries(secrets)
    .filter(([, value]) => haystack.includes(value))
    .map(([name]) => name);
}

function filesUnder(dir: string): string[] {
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((entry) => entry.isFile())
    .map((entry) => path.relative(dir, path.join(entry.parentPath, entry.name)));
}

/** Every row of every table of the database, as PostgreSQL writes a row as text. */
async function postgresRows(url: string): Promise<string> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const tables = await client.query<{ table_schema: string; table_name: string }>(
      "select table_schema, table_name from information_schema.tables where table_type = 'BASE TABLE' and table_schema not in ('pg_catalog', 'information_schema')",
    );
    assert.ok(
      tables.rows.some((t) => t.table_name === "models"),
      "the dump sees llmgw's tables",
    );
    const rows: string[] = [];
    for (const { table_schema: schema, table_name: table } of tables.rows) {
      const result = await client.query<{ row: string }>(`select t::text as row from "${schema}"."${table}" t`);
      rows.push(`${schema}.${table}:`, ...result.rows.map((r) => r.row));
    }
    return rows.join("\n");
  } finally {
    await client.end();
  }
}

/** The process ids below `root` (its children, theirs, ...), from /proc. */
function descendantsOf(root: number): number[] {
  const parents = new Map<number, number>();
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      // The parent pid is the 4th field after the command name, which may hold spaces: read past its last ')'.
      const stat = readFileSync(`/proc/${entry}/stat`, "utf8");
      parents.set(Number(entry), Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]));
    } catch {
      // Gone meanwhile.
    }
  }
  const below: number[] = [];
  const queue = [root];
  while (queue.length > 0) {
    const parent = queue.shift()!;
    for (const [pid, ppid] of parents) {
      if (ppid !== parent) continue;
      below.push(pid);
      queue.push(pid);
    }
  }
  return below;
}

/** The engine key the replica's engine process was started with (its environment: the one place it is plain). */
function engineKeyOf(up: LlmgwProcess): string | undefined {
  for (const pid of descendantsOf(up.child.pid!)) {
    try {
      const variables = readFileSync(`/proc/${pid}/environ`, "utf8").split("\0");
      const key = variables.find((v) => v.startsWith("LLMGW_ENGINE_KEY="))?.slice("LLMGW_ENGINE_KEY=".length);
      if (key !== undefined && key !== "") return key;
    } catch {
      // Gone meanwhile, or not ours to read.
    }
  }
  return undefined;
}

for (const dialect of ["sqlite", "postgres"] as const) {
  test(`no secret is kept in plain text in the database, the data dir or the logs [${dialect}]`, { timeout: 300_000 }, async (t) => {
    // Skipped (or failed, with LLMGW_REQUIRE_POSTGRES=1) where PostgreSQL is not reachable, as every PostgreSQL test.
    if (dialect === "postgres" && (await postgresSchemaOrSkip(t)) === null) return;
    const database = dialect === "postgres" ? await createTestDatabase() : null;
    const dataDir = mkdtempSync(path.join(tmpdir(), "llmgw-secrets-"));
    const hex = () => randomBytes(16).toString("hex");
    const secrets: Secrets = {
      "external api_key": `sk-external-${hex()}`,
      "webhook URL path token": `pathtoken${hex()}`,
      "webhook URL query token": `querytoken${hex()}`,
      // A Standard Webhooks secret: whsec_ and base64; the base64 part is what must not show.
      "webhook signing secret": randomBytes(24).toString("base64"),
      ...(dialect === "postgres" ? { "cluster secret": `cluster-${hex()}-${hex()}` } : {}),
    };
    const upstream = await startFakeUpstream({ key: secrets["external api_key"]!, reply: "answered with the sealed key" });
    const receiver = await startReceiver(`/hooks/${secrets["webhook URL path token"]}`);
    const port = await findFreePort("127.0.0.1");
    const up = spawnLlmgw(
      [
        "up",
        "--demo",
        "--data-dir",
        dataDir,
        "--listen",
        `127.0.0.1:${port}`,
        "--allow-private-webhooks",
        ...(database === null ? [] : ["--database", database.url]),
      ],
      { LLMGW_LOG_LEVEL: "debug", LLMGW_LOG_FORMAT: "json", ...(database === null ? {} : { LLMGW_CLUSTER_SECRET: secrets["cluster secret"]! }) },
    );
    try {
      const url = `http://127.0.0.1:${port}`;
      const firstAdmin = await eventually("the first admin key `up` prints", () => {
        if (up.child.exitCode !== null) throw new Error(`llmgw up exited (${up.child.exitCode}):\n${up.output()}`);
        return /Admin key \(shown once[^\n]*\n\s+(\S+)\n/.exec(up.output())?.[1];
      });
      secrets["first admin key"] = firstAdmin;
      const api = async (method: string, pathname: string, body?: unknown, key = firstAdmin) => {
        const response = await fetch(url + pathname, {
          method,
          headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
          body: body === undefined ? undefined : JSON.stringify(body),
        });
        const text = await response.text();
        // biome-ignore lint/suspicious/noExplicitAny: the test reads a few fields of several admin API answers.
        return { status: response.status, text, body: (text === "" ? null : JSON.parse(text)) as any };
      };
      const created = async (pathname: string, body: unknown) => {
        const answer = await api("POST", pathname, body);
        assert.equal(answer.status, 201, `${pathname}: ${answer.text}`);
        return answer.body;
      };

      secrets["second admin key"] = (await created("/api/v1/keys", { name: "second-admin", role: "admin" })).key;
      assert.equal((await api("GET", "/api/v1/keys", undefined, secrets["second admin key"])).status, 200);
      // A client key replaced by a new one, the old one revoked.
      secrets["replaced client key"] = (await created("/api/v1/keys", { name: "client-old" })).key;
      secrets["client key"] = (await created("/api/v1/keys", { name: "client-new" })).key;
      assert.equal((await api("DELETE", "/api/v1/keys/client-old")).status, 200);

      await created("/api/v1/models", {
        name: MODEL,
        profiles: [{ name: "up", engine: "external", url: upstream.url, api_key: secrets["external api_key"] }],
      });
      const chat = (model: string) =>
        api("POST", "/v1/chat/completions", { model, messages: [{ role: "user", content: "hi" }], max_tokens: 4 }, secrets["client key"]);
      const external = await chat(MODEL);
      assert.equal(external.status, 200, external.text);
      assert.equal(upstream.requests.at(-1)?.authorization, `Bearer ${secrets["external api_key"]}`, "the upstream got the key");

      const signing = `whsec_${secrets["webhook signing secret"]}`;
      receiver.secret = signing;
      await created("/api/v1/notify", { name: "ops-hook", webhook: `${receiver.url}?token=${secrets["webhook URL query token"]}`, secret: signing });
      assert.equal((await api("POST", "/api/v1/notify/ops-hook/test")).status, 200);
      await eventually("the signed test notification", () => receiver.webhooks().some((hook) => hook.verified));

      // The demo model's replica: its engine runs with an engine key, used by this request.
      await eventually("the demo model to answer", async () => (await chat("demo")).status === 200, { timeoutMs: 180_000 });
      secrets["engine key"] = await eventually("the engine's key", () => engineKeyOf(up));
      secrets["join token"] = readFileSync(path.join(dataDir, "join.token"), "utf8").trim();
      secrets["node credential"] = (JSON.parse(readFileSync(path.join(dataDir, "agent", "node.json"), "utf8")) as { credential: string }).credential;
      for (const [name, value] of Object.entries(secrets)) assert.ok(value.length >= 16, `${name} is long enough not to match by chance`);

      // What the API and the CLI show.
      for (const pathname of [
        "/api/v1/models",
        "/api/v1/keys",
        "/api/v1/notify",
        "/api/v1/replicas",
        "/api/v1/audit?limit=1000",
        "/api/v1/events",
        "/api/v1/jobs",
      ]) {
        const answer = await api("GET", pathname);
        assert.equal(answer.status, 200, `${pathname}: ${answer.text}`);
        assert.deepEqual(found(answer.text, secrets), [], `GET ${pathname}`);
      }
      const models = await api("GET", "/api/v1/models");
      assert.equal(models.body.data.find((m: { name: string }) => m.name === MODEL).profiles[0].api_key_set, true);
      const show = spawnSync(process.execPath, [BIN, "ctl", "model", "show", MODEL, "--data-dir", dataDir], { encoding: "utf8", timeout: 60_000 });
      assert.equal(show.status, 0, show.stderr);
      assert.match(show.stdout, new RegExp(MODEL));
      assert.deepEqual(found(show.stdout + show.stderr, secrets), [], "ctl model show");

      // The database while the server runs (the SQLite WAL holds the recent writes).
      const databaseText = async () =>
        database === null
          ? Buffer.concat(["llmgw.db", "llmgw.db-wal"].flatMap((file) => (filesUnder(dataDir).includes(file) ? [readFileSync(path.join(dataDir, file))] : [])))
          : Buffer.from(await postgresRows(database.url));
      const running = await databaseText();
      assert.ok(running.includes(MODEL), "the database read holds the model's name (the search works)");
      assert.deepEqual(found(running, secrets), [], "the database while the server runs");

      await stopAll([up]);
      assert.deepEqual(found(await databaseText(), secrets), [], "the database after the server stopped");

      const byDesign = new Map(Object.entries(CREDENTIAL_FILES));
      const files = filesUnder(dataDir);
      assert.ok(files.includes("llmgw.db") || database !== null, "the data dir scan sees the SQLite file");
      for (const file of files) {
        const bytes = readFileSync(path.join(dataDir, file));
        const own = byDesign.get(file);
        if (own === undefined) {
          assert.deepEqual(found(bytes, secrets), [], `DATA_DIR/${file}`);
        } else {
          assert.deepEqual(found(bytes, secrets), [own], `DATA_DIR/${file} holds the ${own} only`);
          assert.equal(statSync(path.join(dataDir, file)).mode & 0o777, 0o600, `DATA_DIR/${file} is the owner's only`);
        }
      }
      assert.deepEqual(
        [...byDesign.keys()].filter((file) => !files.includes(file)),
        [],
        "every credential file was there to check",
      );

      // The logs: `up` prints the first admin key once, by design; nothing else.
      const output = up.output();
      assert.match(output, /llmgw server listening/);
      const printedOnce = output.replace(`\n  ${firstAdmin}\n`, "\n");
      assert.notEqual(printedOnce, output, "the first admin key was printed where `up` says it is");
      assert.deepEqual(found(printedOnce, secrets), [], "the server's stdout and stderr");
    } finally {
      await stopAll([up]);
      await upstream.close();
      await receiver.close();
      await database?.drop();
      rmSync(dataDir, { recursive: true, force: true });
    }
  });
}
