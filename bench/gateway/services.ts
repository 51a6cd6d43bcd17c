// Child processes of the gateway benchmarks (run.ts, overload.ts): start one, wait until it
// says where it listens, stop it (SIGTERM, then SIGKILL), show the end of its log; and
// calls to an llmgw server's admin API for the setup.
import { spawn, type ChildProcess } from "node:child_process";
import { closeSync, openSync, readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { request } from "undici";

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");

export interface Service {
  name: string;
  child: ChildProcess;
  url: string;
  logFile: string;
}

const LISTEN_LINE = /(?:LISTENING|listening on) (http:\/\/[^\s]+)/;

/** Starts a child and resolves with its URL once it prints that it listens. */
export function startService(options: { name: string; args: string[]; logDir: string; env?: NodeJS.ProcessEnv }): Promise<Service> {
  const logFile = path.join(options.logDir, `${options.name}.log`);
  const log = openSync(logFile, "w");
  const child = spawn(process.execPath, options.args, { cwd: ROOT, stdio: ["ignore", "pipe", log], env: { ...process.env, ...options.env } });
  closeSync(log);
  return new Promise((resolve, reject) => {
    let seen = "";
    const timer = setTimeout(() => fail(new Error(`${options.name} did not report a listening URL within 30 s; see ${logFile}.`)), 30_000);
    const fail = (error: Error) => {
      clearTimeout(timer);
      child.kill("SIGKILL");
      reject(error);
    };
    child.once("exit", (code, signal) =>
      fail(new Error(`${options.name} exited (${signal ?? `code ${code}`}) before listening; see ${logFile}:\n${tail(logFile)}`)),
    );
    child.stdout!.setEncoding("utf8");
    child.stdout!.on("data", (text: string) => {
      seen += text;
      const match = LISTEN_LINE.exec(seen);
      if (match === null) return;
      clearTimeout(timer);
      child.removeAllListeners("exit");
      // Keep reading (and dropping) what it prints later, so its pipe never fills.
      child.stdout!.removeAllListeners("data");
      child.stdout!.resume();
      resolve({ name: options.name, child, url: match[1]!, logFile });
    });
  });
}

export function tail(file: string, lines = 20): string {
  try {
    return readFileSync(file, "utf8").trimEnd().split("\n").slice(-lines).join("\n");
  } catch {
    return "(no log)";
  }
}

/** SIGTERM, then SIGKILL after a grace period; resolves when the child has exited. */
export function stopService(service: Service): Promise<void> {
  const { child } = service;
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(() => child.kill("SIGKILL"), 10_000);
    child.once("exit", () => {
      clearTimeout(timer);
      resolve();
    });
    child.kill("SIGTERM");
  });
}

export async function api(url: string, key: string, method: "GET" | "POST" | "PATCH" | "DELETE", body?: unknown): Promise<unknown> {
  const response = await request(url, {
    method,
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.body.text();
  if (response.statusCode >= 300) throw new Error(`${method} ${url} answered ${response.statusCode}: ${text}`);
  return JSON.parse(text) as unknown;
}
