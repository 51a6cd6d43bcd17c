// Streams that fail, end to end with real engines: a server with the local agent running
// `llmgw engine` on a tiny generated model, and the official openai client. Whatever stops
// an engine in the middle of a stream (kill -9, the model deleted), the client's
// iteration raises an APIError that says so: never a bare socket reset, never a clean end.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import OpenAI from "openai";
import { writeTinyLlamaGguf } from "../src/gguf/tiny-model.ts";
import type { NodeAgent } from "../src/agent/node-agent.ts";
import { startHarnessWithAgent, type Harness } from "./support/server-harness.ts";
import { eventually } from "./support/eventually.ts";

describe("streams that fail", () => {
  let harness: Harness;
  let agent: NodeAgent;
  let modelDir: string;
  let modelFile: string;
  let client: OpenAI;

  before(async () => {
    modelDir = mkdtempSync(path.join(tmpdir(), "llmgw-stream-failure-"));
    modelFile = path.join(modelDir, "tiny.gguf");
    await writeTinyLlamaGguf({ path: modelFile, seed: 11, contextLength: 16384, endless: true });
    ({ harness, agent } = await startHarnessWithAgent({ supervisor: { backoff: { initialMs: 50, maxMs: 200 }, stopGraceMs: 3000 } }));
    client = new OpenAI({ apiKey: await harness.clientKey(), baseURL: `${harness.url}/v1`, maxRetries: 0 });
  });

  after(async () => {
    await harness.close();
    rmSync(modelDir, { recursive: true, force: true });
  });

  /** Adds a model and waits until its engine answers. */
  const serve = async (name: string) => {
    const created = await harness.admin("POST", "/api/v1/models", {
      name,
      source: { kind: "file", path: modelFile },
      profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 16384, parallel: 1 }],
    });
    assert.equal(created.status, 201, JSON.stringify(created.body));
    await eventually(`model ${name} ready`, () => harness.server.replicas.all().some((r) => r.modelName === name && r.state === "ready"), {
      timeoutMs: 120_000,
    });
  };

  /**
   * Starts a long stream, calls `interrupt` once its first chunk has arrived, and returns
   * how the client's iteration ended. The model never ends a greedy generation on its own
   * (`endless`), and the stream asks for far more tokens than the interruption leaves time for.
   */
  const interruptedStream = async (model: string, interrupt: () => Promise<void>) => {
    const stream = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 12_000, stream: true, temperature: 0 });
    let chunks = 0;
    try {
      for await (const _chunk of stream) {
        chunks += 1;
        if (chunks === 1) await interrupt();
      }
    } catch (error) {
      return { chunks, error };
    }
    return { chunks, error: null };
  };

  test("an engine killed with SIGKILL mid-stream: the client gets an APIError saying the replica failed", { timeout: 240_000 }, async () => {
    await serve("killed");
    const { chunks, error } = await interruptedStream("killed", async () => {
      const engine = agent.engineProcesses().find((p) => p.modelName === "killed");
      assert.ok(engine, "the engine runs");
      process.kill(engine.pid, "SIGKILL");
    });
    assert.ok(chunks >= 1);
    assert.ok(error instanceof OpenAI.APIError, `expected an APIError, got ${String(error)}`);
    assert.ok(!(error instanceof OpenAI.APIConnectionError), "not a bare connection error");
    assert.equal(error.code, "upstream_failed");
    await harness.admin("DELETE", "/api/v1/models/killed");
  });

  test("a model deleted mid-stream: the client gets an APIError from the stopping engine", { timeout: 240_000 }, async () => {
    await serve("deleted");
    const { chunks, error } = await interruptedStream("deleted", async () => {
      assert.equal((await harness.admin("DELETE", "/api/v1/models/deleted")).status, 200);
    });
    assert.ok(chunks >= 1);
    assert.ok(error instanceof OpenAI.APIError, `expected an APIError, got ${String(error)}`);
    assert.ok(!(error instanceof OpenAI.APIConnectionError), "not a bare connection error");
  });
});
