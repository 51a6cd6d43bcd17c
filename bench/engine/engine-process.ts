// A `llmgw engine` child process for the engine benchmarks: started on a free port with
// the benchmark's key, ready once /health answers 200, stopped with SIGTERM. Its stderr is
// kept, so a failed start says why and the caller can read the engine's last log lines.
// Also the benchmark model's shape, which run.ts and features.ts share.
import { spawn, type ChildProcess } from "node:child_process";
import { createServer } from "node:net";
import { ENGINE_THREAD_POOL_SIZE } from "../../src/engines/llamacpp/engine-launch.ts";

export const ENGINE_KEY = "bench-engine-key";

/**
 * The benchmark model: 6 layers of 1024 wide, F32, ~330 MB. At this size one decode step
 * reads all the weights from memory, and written with `endless: true` it never ends a reply
 * on its own, so every generation runs to max_tokens.
 */
export const BENCH_MODEL_SHAPE = { embeddingLength: 1024, layers: 6, heads: 8, feedForwardLength: 3072, contextLength: 4096 };

export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as { port: number };
      server.close(() => resolve(port));
    });
  });
}

export interface EngineProcess {
  readonly child: ChildProcess;
  readonly url: string;
  stderr(): string;
  /** POSTs JSON to the engine with its key; returns the status and the parsed answer, of the shape the caller expects. */
  post<T = unknown>(path: string, body: unknown): Promise<{ status: number; body: T }>;
  /** SIGTERM, then waits for the exit. */
  stop(): Promise<void>;
}

/** Starts `entry engine --model modelPath --port P --key K ...args` and waits until it is ready (120 s at most). */
export async function startEngineProcess(options: { label: string; entry: string; modelPath: string; args: string[] }): Promise<EngineProcess> {
  const port = await freePort();
  const child = spawn(process.execPath, [options.entry, "engine", "--model", options.modelPath, "--port", String(port), "--key", ENGINE_KEY, ...options.args], {
    // The pool size llmgw's launcher gives the engine (engine-launch.ts says why).
    env: { ...process.env, LLMGW_LOG_LEVEL: "info", UV_THREADPOOL_SIZE: ENGINE_THREAD_POOL_SIZE },
    stdio: ["ignore", "ignore", "pipe"],
  });
  let stderr = "";
  child.stderr?.setEncoding("utf8").on("data", (text: string) => {
    stderr += text;
  });
  const url = `http://127.0.0.1:${port}`;
  const engine: EngineProcess = {
    child,
    url,
    stderr: () => stderr,
    post: async <T>(path: string, body: unknown) => {
      const response = await fetch(`${url}${path}`, {
        method: "POST",
        headers: { authorization: `Bearer ${ENGINE_KEY}`, "content-type": "application/json" },
        body: JSON.stringify(body),
      });
      return { status: response.status, body: (await response.json()) as T };
    },
    stop: async () => {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const exited = new Promise((resolve) => child.once("exit", resolve));
      child.kill("SIGTERM");
      await exited;
    },
  };
  const deadline = Date.now() + 120_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`the ${options.label} engine exited: ${stderr}`);
    const status = await fetch(`${url}/health`).then(
      (r) => r.status,
      () => 0,
    );
    if (status === 200) return engine;
    if (Date.now() > deadline) {
      await engine.stop();
      throw new Error(`the ${options.label} engine was not ready within 120 s: ${stderr}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}
