// Where the server listens, keeps its data and stores its state, from flags, then
// environment, then defaults (DESIGN.md "Processes").
import os from "node:os";
import path from "node:path";
import { BadRequestError } from "../core/errors.ts";

export const DEFAULT_LISTEN = "127.0.0.1:8700";

export function resolveDataDir(flag: string | undefined): string {
  const chosen = flag ?? process.env.LLMGW_DATA_DIR ?? path.join(os.homedir(), ".llmgw");
  return path.resolve(chosen);
}

/** Parses `host:port`, `:port` or `port`; IPv6 hosts go in brackets (`[::1]:8700`). */
export function parseListen(value: string): { host: string; port: number } {
  const match = /^(?:\[(?<v6>[^\]]+)\]|(?<host>[^:]*))?:?(?<port>\d+)$/.exec(value.trim());
  const port = Number(match?.groups?.port);
  if (match === null || !Number.isInteger(port) || port < 0 || port > 65535) {
    throw new BadRequestError(`Invalid --listen '${value}': use host:port, for example 127.0.0.1:8700 or 0.0.0.0:8700.`);
  }
  const host = match.groups?.v6 ?? (match.groups?.host || "127.0.0.1");
  return { host, port };
}

export function resolveDatabase(flag: string | undefined, dataDir: string): string {
  return flag ?? process.env.LLMGW_DATABASE ?? path.join(dataDir, "llmgw.db");
}

export function parsePositiveInt(value: string, flag: string, { allowZero = false } = {}): number {
  const number = Number(value);
  if (!Number.isInteger(number) || number < (allowZero ? 0 : 1)) {
    throw new BadRequestError(`Invalid ${flag} '${value}': expected ${allowZero ? "a whole number ≥ 0" : "a whole number ≥ 1"}.`);
  }
  return number;
}

/** Parses a duration like 30s, 500ms, 2m or a plain number of seconds into milliseconds. */
export function parseDuration(value: string, flag: string): number {
  const match = /^(\d+(?:\.\d+)?)\s*(ms|s|m|h)?$/i.exec(value.trim());
  const ms = match === null ? NaN : Number(match[1]) * { ms: 1, s: 1000, m: 60_000, h: 3_600_000 }[(match[2] ?? "s").toLowerCase() as "ms" | "s" | "m" | "h"];
  if (!Number.isFinite(ms) || ms <= 0) throw new BadRequestError(`Invalid ${flag} '${value}': use a duration like 30s, 500ms, 2m or 6h.`);
  return Math.round(ms);
}
