// From a repository to an answer, the way an operator does it before serve jobs exist:
// `ctl mirror fetch` (stand-in Hub → mirror, verified), `ctl model add --mirror`, then a
// chat request through the gateway to the bundled engine that the local agent starts on
// the mirrored file. Also the mirror's file server as a node agent will use it.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import OpenAI from "openai";
import { silentLogger } from "../src/core/log.ts";
import { LocalAgent } from "../src/agent/local-agent.ts";
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
        const agent = new LocalAgent({
          catalog: parts.catalog,
          replicas: parts.replicas,
          mirror: parts.mirror,
          logger: silentLogger(),
          stateRoot: path.join(parts.config.dataDir, "runs"),
          nodeId: "local",
        });
        await agent.start();
        return agent;
      },
    });
  });

  after(async () => {
    await harness.close();
    await hub.close();
  });

  const ctl = (args: string[]) => run(process.execPath, [BIN, "ctl", "--server", harness.url, "--key", harness.adminKey, ...args], { env: { ...process.env, LLMGW_LOG_LEVEL: "silent" } });

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
    const whole = Buffer.from(await (await fetch(url, { headers: { authorization: `Bearer ${harness.adminKey}` } })).arrayBuffer());
    assert.equal(createHash("sha256").update(whole).digest("hex"), row.sha256);
    const ranged = await fetch(url, { headers: { authorization: `Bearer ${harness.adminKey}`, range: "bytes=0-3" } });
    assert.equal(ranged.status, 206);
    assert.equal(ranged.headers.get("etag"), `"${row.sha256}"`);
    assert.equal(Buffer.from(await ranged.arrayBuffer()).toString("latin1"), "GGUF");
    assert.equal((await fetch(url)).status, 401, "the mirror refuses callers without a key");

    await ctl(["model", "add", "tiny", "--mirror", serveLine[1]!, "--ctx-size", "1024", "--parallel", "1"]);
    const client = new OpenAI({ apiKey: harness.adminKey, baseURL: `${harness.url}/v1`, maxRetries: 0 });
    const deadline = Date.now() + 90_000;
    for (;;) {
      try {
        const answer = await client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "Hello" }], max_tokens: 4 });
        assert.equal(answer.usage?.completion_tokens, 4);
        break;
      } catch (error) {
        if (!(error instanceof OpenAI.APIError) || error.status !== 503 || Date.now() > deadline) throw error;
        await new Promise((r) => setTimeout(r, 250));
      }
    }
  });

  test("a model whose mirrored file is not there fails with a reason that says to fetch it", async () => {
    await ctl(["model", "add", "absent", "--mirror", "nobody/000000000000/x.gguf"]);
    const deadline = Date.now() + 30_000;
    let reason = "";
    while (Date.now() < deadline) {
      const { body } = await harness.admin("GET", "/api/v1/models/absent");
      reason = body.health.reason ?? "";
      if (/not in the mirror/.test(reason)) break;
      await new Promise((r) => setTimeout(r, 200));
    }
    assert.match(reason, /not in the mirror yet \(nobody\/000000000000\/x\.gguf\).*ctl mirror fetch/);
    await harness.admin("DELETE", "/api/v1/models/absent");
  });
});
