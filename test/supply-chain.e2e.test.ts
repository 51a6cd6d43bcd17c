// From a repository to an answer, the way an operator does it before serve jobs exist:
// `ctl mirror fetch` (stand-in Hub → mirror, verified), `ctl model add --mirror`, then a
// chat request through the gateway to the bundled engine that the local agent starts on
// the mirrored file. Also the mirror's file server as a node agent will use it.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { readFile, utimes, writeFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import OpenAI from "openai";
import { followFetch } from "../src/cli/ctl-mirror.ts";
import { LlmgwError, type RenderedError } from "../src/core/errors.ts";
import { silentLogger } from "../src/core/log.ts";
import { startLocalNode } from "../src/agent/local-node.ts";
import { readAudit } from "../src/store/audit.ts";
import { ctlRunner } from "./support/ctl-runner.ts";
import { eventually } from "./support/eventually.ts";
import { startHarness, type Harness } from "./support/server-harness.ts";
import { startStandInHub, type StandInHub } from "./support/stand-in-hub.ts";
import { buildStandInRepos, GGUF_REPO } from "./support/stand-in-repos.ts";

const BIN = fileURLToPath(new URL("../bin/llmgw.js", import.meta.url));
const run = promisify(execFile);

describe("weights supply chain", () => {
  let hub: StandInHub;
  let harness: Harness;

  before(async () => {
    hub = await startStandInHub({ repos: (await buildStandInRepos()).all });
    harness = await startHarness({
      registryEndpoint: hub.url,
      withAgent: async (parts) => {
        return startLocalNode(parts, { logger: silentLogger(), name: "local" });
      },
    });
  });

  after(async () => {
    await harness.close();
    await hub.close();
  });

  const { ctl, ctlFails } = ctlRunner(() => harness);

  test("ctl mirror fetch, model add --mirror, and a chat answer from the mirrored file", { timeout: 120_000 }, async () => {
    const fetched = await ctl(["mirror", "fetch", GGUF_REPO, "--quant", "Q8_0", "--model", "tiny"]);
    const serveLine = /llmgw ctl model add NAME --mirror (\S+)/.exec(fetched.stdout);
    assert.ok(serveLine, fetched.stdout);
    const [mirrorModel, version, ...file] = serveLine[1]!.split("/");
    assert.equal(mirrorModel, "tiny");
    assert.equal(version!.length, 12);
    assert.equal(file.join("/"), "tiny-llama-Q8_0.gguf");

    const listed = JSON.parse((await ctl(["mirror", "list", "--json"])).stdout);
    const row = listed.data.find((f: { file: string }) => f.file === "tiny-llama-Q8_0.gguf");
    assert.equal(row.state, "complete");
    assert.equal(row.actualSha256, row.sha256, "the bytes match what the registry published");

    // Fetching the same commit again downloads nothing.
    const downloadsBefore = hub.requests.filter((r) => r.path.startsWith("/cdn/")).length;
    await ctl(["mirror", "fetch", GGUF_REPO, "--quant", "Q8_0", "--model", "tiny"]);
    assert.equal(hub.requests.filter((r) => r.path.startsWith("/cdn/")).length, downloadsBefore);

    // The file server answers a node's ranged request with the right bytes and the sha256 as ETag.
    const url = `${harness.url}/mirror/tiny/${version}/tiny-llama-Q8_0.gguf`;
    const node = { authorization: `Bearer ${harness.nodeCredential()}` };
    const whole = Buffer.from(await (await fetch(url, { headers: node })).arrayBuffer());
    assert.equal(createHash("sha256").update(whole).digest("hex"), row.sha256);
    const ranged = await fetch(url, { headers: { ...node, range: "bytes=0-3" } });
    assert.equal(ranged.status, 206);
    assert.equal(ranged.headers.get("etag"), `"${row.sha256}"`);
    assert.equal(Buffer.from(await ranged.arrayBuffer()).toString("latin1"), "GGUF");
    assert.equal((await fetch(url)).status, 401, "the mirror refuses callers without a credential");
    const withAdminKey = await fetch(url, { headers: { authorization: `Bearer ${harness.adminKey}` } });
    assert.equal(withAdminKey.status, 401, "an admin key is not a node credential");
    assert.equal(((await withAdminKey.json()) as RenderedError["body"]).error.code, "invalid_node_credential");

    await ctl(["model", "add", "tiny", "--mirror", serveLine[1]!, "--ctx-size", "1024", "--parallel", "1"]);
    const client = new OpenAI({ apiKey: harness.adminKey, baseURL: `${harness.url}/v1`, maxRetries: 0 });
    // 503 while the engine starts; any other failure ends the wait at once.
    const outcome = await eventually(
      "a chat answer from the mirrored model",
      async () => {
        try {
          return { answer: await client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "Hello" }], max_tokens: 4 }) };
        } catch (error) {
          return error instanceof OpenAI.APIError && error.status === 503 ? false : { error };
        }
      },
      { timeoutMs: 90_000 },
    );
    if ("error" in outcome) throw outcome.error;
    // The model's weights are random: it may sample its end-of-text token before the limit.
    const completion = outcome.answer.usage?.completion_tokens ?? 0;
    if (outcome.answer.choices[0]?.finish_reason === "length") assert.equal(completion, 4);
    else assert.ok(completion >= 1 && completion <= 4, `completion tokens ${completion}`);
  });

  test("mirror fetch without --quant takes what model plan recommends; verify reports a changed file and exits non-zero; rm of a used version needs --force; all audited", {
    timeout: 120_000,
  }, async () => {
    const planned = JSON.parse((await ctl(["model", "plan", GGUF_REPO, "--json"])).stdout);
    const recommendation = planned.plan.recommendation;
    const recommended = planned.plan.artifacts.find((a: { id: string }) => a.id === recommendation.artifact.id);
    // The default would be Q4_K_M; the plan recommends the best quality that fits this machine.
    assert.notEqual(recommended.label, "Q4_K_M");

    const fetched = await ctl(["mirror", "fetch", GGUF_REPO, "--model", "planned"]);
    assert.match(fetched.stdout, new RegExp(`^Picked ${recommended.label}: what 'llmgw ctl model plan' recommends for this server`, "m"));
    const serveLine = /llmgw ctl model add NAME --mirror (\S+)/.exec(fetched.stdout);
    assert.ok(serveLine, fetched.stdout);
    const [, version, ...fileParts] = serveLine[1]!.split("/");
    const file = fileParts.join("/");
    assert.equal(file, recommended.files[0], "mirror fetch and model plan pick the same file");

    const clean = await ctl(["mirror", "verify", "planned", version!]);
    assert.match(clean.stdout, new RegExp(`^ok +planned/${version}/${file}$`, "m"));
    assert.match(clean.stdout, /Verified 1 file: 1 ok, 0 failed, 0 skipped\./);

    await ctl(["model", "add", "planned-model", "--mirror", serveLine[1]!, "--replicas", "0"]);

    // Same size, other bytes, as a bad disk or a stray editor would leave it.
    const onDisk = path.join(harness.dataDir, "mirror", "planned", version!, file);
    const bytes = await readFile(onDisk);
    bytes[4096] = (bytes[4096] ?? 0) ^ 0xff;
    await writeFile(onDisk, bytes);
    const later = new Date(Date.now() + 120_000);
    await utimes(onDisk, later, later);
    const served = await fetch(`${harness.url}/mirror/planned/${version}/${file}`, { headers: { authorization: `Bearer ${harness.nodeCredential()}` } });
    assert.equal(served.status, 409, "a changed file is not served under its old sha256");
    await served.body?.cancel();

    const failing = await ctlFails(["mirror", "verify", "planned"]);
    assert.equal(failing.code, 1);
    assert.match(
      failing.stdout,
      new RegExp(
        `^FAILED +planned/${version}/${file}: The bytes .* no longer match: they were verified with sha256 [0-9a-f]{64}, the file now has sha256 [0-9a-f]{64}`,
        "m",
      ),
    );
    assert.match(failing.stdout, /Verified 1 file: 0 ok, 1 failed, 0 skipped\. Failed files are no longer served/);

    const refused = await ctlFails(["mirror", "rm", "planned", version!]);
    assert.equal(refused.code, 1);
    assert.match(refused.stderr, /in use by the catalog model 'planned-model'.*--force/);
    const forced = await ctl(["mirror", "rm", "planned", version!, "--force"]);
    assert.match(forced.stdout, /^Deleted planned\/\w+: 1 file, .*The catalog model 'planned-model' used it and now has no weights\.$/m);

    const audit = await readAudit(harness.server.store.db, { action: "mirror." });
    const mine = audit.filter((e) => e.target.startsWith("planned")).reverse();
    assert.deepEqual(
      mine.map((e) => [e.actor, e.action]),
      [
        ["admin:admin", "mirror.fetch"],
        ["admin:admin", "mirror.verify"],
        ["admin:admin", "mirror.verify"],
        ["admin:admin", "mirror.delete"],
      ],
    );
    assert.deepEqual([mine[2]?.detail.ok, mine[2]?.detail.failed], [0, 1]);
    assert.equal(mine[3]?.detail.force, true);
    await harness.admin("DELETE", "/api/v1/models/planned-model");
  });

  test("ctl model add of a mirrored file that is not there is refused at the door, saying to fetch it", async () => {
    await assert.rejects(ctl(["model", "add", "absent", "--mirror", "nobody/000000000000/x.gguf"]), (error: { code: number; stderr: string }) => {
      assert.equal(error.code, 1);
      assert.match(error.stderr, /cannot be used from the mirror \(nobody\/000000000000\/x\.gguf\): The mirror has no complete file .*llmgw ctl mirror fetch/);
      return true;
    });
    assert.equal((await harness.admin("GET", "/api/v1/models/absent")).status, 404, "nothing was stored");
  });
});

describe("ctl mirror fetch when the fetch stops", () => {
  let hub: StandInHub;
  let harness: Harness;

  before(async () => {
    hub = await startStandInHub({ repos: (await buildStandInRepos()).all });
    harness = await startHarness({ registryEndpoint: hub.url });
  });

  after(async () => {
    await harness.close();
    await hub.close();
  });

  test("a fetch the server stops ends as interrupted with a non-zero exit, not a poll without end", { timeout: 60_000 }, async () => {
    // The CDN never answers, so the download is certainly in flight when the server stops it.
    hub.setFault({ kind: "hang", match: "/cdn/" });
    try {
      const fetching = run(
        process.execPath,
        [BIN, "ctl", "--server", harness.url, "--key", harness.adminKey, "mirror", "fetch", GGUF_REPO, "--quant", "Q8_0", "--model", "stopped"],
        {
          env: { ...process.env, LLMGW_LOG_LEVEL: "silent" },
          timeout: 30_000,
        },
      ).then(
        () => null,
        (error: { code: number | null; stdout: string; stderr: string }) => error,
      );
      await eventually("the fetch to start", async () => (await harness.admin("GET", "/api/v1/mirror?model=stopped")).body.data[0]?.state === "fetching");
      // Stands for the server stopping: the rows are left pending with nothing working on
      // them, exactly as recover() leaves them after a restart.
      await harness.server.mirror.close();
      const failure = await fetching;
      assert.ok(failure !== null, "ctl exited 0");
      assert.equal(failure.code, 1, failure.stderr);
      assert.match(failure.stdout, /was interrupted: 1 of 1 file is unfinished/);
      assert.match(failure.stdout, /Run the same fetch again to resume/);
    } finally {
      hub.setFault(null);
    }
  });
});

describe("followFetch", () => {
  const started = { model: "m", version: "0123456789ab", repo: "owner/name", files: [{ path: "a.gguf" }, { path: "b.gguf" }] };
  const row = (file: string, state: string, active: boolean) => ({ model: "m", version: started.version, file, state, active, bytesDone: 10, bytesTotal: 100 });
  /** Stands for the admin API: answers GET /api/v1/mirror with the next listing (the last one repeats). */
  const serving = (...listings: unknown[][]) => {
    let polls = 0;
    return {
      get polls() {
        return polls;
      },
      call: async <T>(): Promise<T> => ({ data: listings[Math.min(polls++, listings.length - 1)] }) as T,
    };
  };

  test("rows left pending with nothing active end the wait as interrupted", { timeout: 10_000 }, async () => {
    const client = serving([row("a.gguf", "complete", false), row("b.gguf", "pending", false)]);
    const followed = await followFetch(client, started, { draw: false, pollMs: 5 });
    assert.equal(followed.state, "interrupted");
    assert.equal(followed.files.length, 2);
  });

  test("rows an earlier run left pending are waited on while the server marks them active", { timeout: 10_000 }, async () => {
    const client = serving(
      [row("a.gguf", "pending", true), row("b.gguf", "pending", true)],
      [row("a.gguf", "complete", false), row("b.gguf", "fetching", true)],
      [row("a.gguf", "complete", false), row("b.gguf", "failed", false)],
    );
    const followed = await followFetch(client, started, { draw: false, pollMs: 5 });
    assert.equal(followed.state, "settled");
    assert.equal(client.polls, 3);
  });

  test("a fetch whose rows never appear is given up with what to do", { timeout: 10_000 }, async () => {
    const client = serving([], [row("a.gguf", "complete", false)]);
    await assert.rejects(followFetch(client, started, { draw: false, pollMs: 10, appearTimeoutMs: 200 }), (error: unknown) => {
      assert.ok(error instanceof LlmgwError);
      assert.equal(error.code, "mirror_fetch_lost");
      assert.match(error.message, /only 1 of its 2 files appeared in the mirror within 0.2 s and nothing is fetching them/);
      assert.match(error.message, /m\/0123456789ab/);
      assert.match(error.message, /run the same fetch again/i);
      return true;
    });
    assert.ok(client.polls > 2);
  });
});
