// The example load balancer (deploy/haproxy/haproxy.cfg) in front of test servers: the
// file as shipped, with its listening line and its server addresses replaced, so the tests
// run what operators copy. Used by the many-servers and the chaos tests.
import { spawn, type ChildProcess } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import assert from "node:assert/strict";
import { findFreePort } from "../../src/agent/free-port.ts";
import { eventually } from "./eventually.ts";
import { findTool, HAPROXY } from "./tools.ts";

export interface Balancer {
  child: ChildProcess;
  url: string;
  stop(): void;
}

/**
 * Starts HAProxy with the example config for servers a and b (their base URLs), writing
 * the config into `folder`. Resolves once it answers /healthz.
 */
export async function startBalancer(folder: string, servers: { a: string; b: string }): Promise<Balancer> {
  const port = await findFreePort("127.0.0.1");
  const example = readFileSync(fileURLToPath(new URL("../../deploy/haproxy/haproxy.cfg", import.meta.url)), "utf8");
  const config = example
    .replace(/^ {4}bind :8700$/m, `    bind 127.0.0.1:${port}`)
    .replace(/^( {4}server llmgw-a(?:-anyway)?) 10\.0\.0\.5:8700/gm, `$1 ${new URL(servers.a).host}`)
    .replace(/^( {4}server llmgw-b(?:-anyway)?) 10\.0\.0\.6:8700/gm, `$1 ${new URL(servers.b).host}`);
  assert.ok(config.includes(`bind 127.0.0.1:${port}`) && !config.includes("10.0.0."), "the example config has the lines this helper replaces");
  const file = path.join(folder, "haproxy.cfg");
  writeFileSync(file, config);
  const child = spawn(findTool(HAPROXY), ["-f", file, "-db"], { stdio: ["ignore", "ignore", "pipe"] });
  let errors = "";
  child.stderr!.on("data", (chunk: Buffer) => (errors += chunk.toString()));
  child.on("exit", (code) => {
    if (code !== 0 && code !== null) errors += `\n(haproxy exited with ${code})`;
  });
  const url = `http://127.0.0.1:${port}`;
  await eventually("HAProxy to answer", async () => {
    if (child.exitCode !== null) throw new Error(`haproxy exited: ${errors}`);
    return (await fetch(`${url}/healthz`)).status === 200;
  });
  return { child, url, stop: () => child.kill("SIGTERM") };
}
