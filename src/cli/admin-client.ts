// The HTTP client `llmgw ctl` uses for the admin API. It finds the server and the admin
// key the way DESIGN.md says: flags, then LLMGW_SERVER / LLMGW_KEY, then the data dir of
// a local `llmgw up` (server.json and admin.key), and turns failures into one clear line.
// The data dir is where this most often goes wrong: a server started with --data-dir keeps
// its key there, and a ctl run without the same --data-dir (or LLMGW_DATA_DIR) looks in
// ~/.llmgw; so the errors about a missing or refused key name the data dir ctl read and
// both ways to give the right one.
import { readFileSync } from "node:fs";
import path from "node:path";
import { request, type Dispatcher } from "undici";
import { AuthenticationError, LlmgwError, UpstreamError } from "../core/errors.ts";
import { ADMIN_KEY_FILE, SERVER_INFO_FILE } from "../core/data-dir.ts";
import { DEFAULT_LISTEN, resolveDataDir } from "./config.ts";

export interface AdminConnectionFlags {
  server?: string;
  key?: string;
  dataDir?: string;
}

export class AdminClient {
  constructor(
    readonly baseUrl: string,
    private readonly key: string,
    /** Where the key came from when it was read from a data dir's admin.key (and how that data dir was chosen): a refusal of it says so. */
    private readonly keyFile?: { file: string; dataDirFrom: string },
  ) {}

  static fromFlags(flags: AdminConnectionFlags): AdminClient {
    const dataDir = resolveDataDir(flags.dataDir);
    const dataDirFrom =
      flags.dataDir !== undefined
        ? "given with --data-dir"
        : process.env.LLMGW_DATA_DIR !== undefined
          ? "given with LLMGW_DATA_DIR"
          : "the default, since neither --data-dir nor LLMGW_DATA_DIR is set";
    const baseUrl = (flags.server ?? process.env.LLMGW_SERVER ?? readServerUrl(dataDir) ?? `http://${DEFAULT_LISTEN}`).replace(/\/+$/, "");
    const given = flags.key ?? process.env.LLMGW_KEY;
    if (given !== undefined) return new AdminClient(baseUrl, given);
    const file = path.join(dataDir, ADMIN_KEY_FILE);
    const key = readKeyFile(file);
    if (key === undefined) {
      throw new AuthenticationError(
        `No admin key: there is no ${file} (data dir ${dataDir}: ${dataDirFrom}). ` +
          `For a server started with --data-dir DIR, run ctl with the same --data-dir DIR or set LLMGW_DATA_DIR=DIR; ` +
          `for a server elsewhere, pass its admin key with --key or LLMGW_KEY (and its address with --server or LLMGW_SERVER).`,
        { code: "missing_api_key" },
      );
    }
    return new AdminClient(baseUrl, key, { file, dataDirFrom });
  }

  async call<T = unknown>(method: string, pathname: string, body?: unknown): Promise<T> {
    let response: Dispatcher.ResponseData;
    try {
      response = await request(this.baseUrl + pathname, {
        method: method as "GET",
        headers: { authorization: `Bearer ${this.key}`, ...(body === undefined ? {} : { "content-type": "application/json" }) },
        body: body === undefined ? undefined : JSON.stringify(body),
        headersTimeout: 60_000,
        bodyTimeout: 60_000,
      });
    } catch (error) {
      throw new UpstreamError(
        `Cannot reach llmgw at ${this.baseUrl} (${(error as NodeJS.ErrnoException).code ?? (error as Error).message}). Is 'llmgw up' or 'llmgw server' running? Pass --server or set LLMGW_SERVER.`,
        { cause: error },
      );
    }
    const text = await response.body.text();
    const parsed = text === "" ? null : safeJson(text);
    if (response.statusCode >= 400) {
      const detail = (parsed as { error?: { message?: string; code?: string } } | null)?.error;
      const message = detail?.message ?? `HTTP ${response.statusCode} from ${pathname}`;
      throw new LlmgwError({
        message: response.statusCode === 401 ? `${message}${this.keyFileHint()}` : message,
        code: detail?.code ?? "http_error",
        status: response.statusCode,
      });
    }
    return parsed as T;
  }

  /** For a refused key read from a data dir: which file it was, and how to name the server's own data dir. */
  private keyFileHint(): string {
    if (this.keyFile === undefined) return "";
    return (
      ` (ctl read the admin key from ${this.keyFile.file}; that data dir is ${this.keyFile.dataDirFrom}. ` +
      `If ${this.baseUrl} was started with another --data-dir DIR, run ctl with the same --data-dir DIR or set LLMGW_DATA_DIR=DIR; or pass the key with --key or LLMGW_KEY.)`
    );
  }

  /** A long-lived GET (server-sent events): its body as it arrives; errors as `call` gives them. */
  async stream(pathname: string, headers: Record<string, string> = {}): Promise<AsyncIterable<Buffer>> {
    let response: Dispatcher.ResponseData;
    try {
      response = await request(this.baseUrl + pathname, {
        method: "GET",
        headers: { ...headers, authorization: `Bearer ${this.key}`, accept: "text/event-stream" },
        headersTimeout: 60_000,
        bodyTimeout: 0,
      });
    } catch (error) {
      throw new UpstreamError(
        `Cannot reach llmgw at ${this.baseUrl} (${(error as NodeJS.ErrnoException).code ?? (error as Error).message}). Is 'llmgw up' or 'llmgw server' running? Pass --server or set LLMGW_SERVER.`,
        { cause: error },
      );
    }
    if (response.statusCode >= 400) {
      const detail = (safeJson(await response.body.text()) as { error?: { message?: string; code?: string } } | null)?.error;
      const message = detail?.message ?? `HTTP ${response.statusCode} from ${pathname}`;
      throw new LlmgwError({
        message: response.statusCode === 401 ? `${message}${this.keyFileHint()}` : message,
        code: detail?.code ?? "http_error",
        status: response.statusCode,
      });
    }
    return response.body;
  }
}

function readServerUrl(dataDir: string): string | undefined {
  try {
    const info = JSON.parse(readFileSync(path.join(dataDir, SERVER_INFO_FILE), "utf8")) as { url?: string };
    return info.url;
  } catch {
    return undefined;
  }
}

/**
 * The key in a data dir's admin.key; undefined when there is no such file (or it is empty).
 * A file that is there but cannot be read (the server ran as root and wrote it 0600) is its
 * own error: "there is no admin.key, pass --data-dir" would send the user to the flag they
 * already gave.
 */
function readKeyFile(file: string): string | undefined {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    // ENOTDIR: the data dir is a file, so there is no admin.key in it either.
    if (code === "ENOENT" || code === "ENOTDIR") return undefined;
    throw new AuthenticationError(
      `No admin key: ${file} exists but cannot be read (${code ?? (error as Error).message}). ` +
        "Run ctl as the user that runs the server, or pass the admin key with --key or LLMGW_KEY.",
      { code: "admin_key_unreadable", cause: error },
    );
  }
  const key = text.trim();
  return key === "" ? undefined : key;
}

function safeJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return { error: { message: text.slice(0, 500) } };
  }
}
