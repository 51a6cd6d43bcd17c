// Where a download's bytes come from over HTTP: one GET from an offset (`Range`), following
// redirects by hand so the registry's Authorization never reaches another host (the Hub's
// CDN gets a signed URL; src/registry/redirects.ts), and the answer read as the mirror
// needs it: where the body starts, the whole size, or an error that says what to do.
import type { Readable } from "node:stream";
import { request, type Dispatcher } from "undici";
import { UpstreamError, type LlmgwError } from "../core/errors.ts";
import { followRedirects } from "../registry/redirects.ts";
import { MirrorTransientError, SourceError, origin } from "./mirror-errors.ts";
import type { MirrorFetchFile } from "./mirror-types.ts";

/** An opened source: the bytes of a file from some offset. */
export interface Source {
  /** The first byte the body holds. */
  start: number;
  /** The whole file's size as the source announced it, when it did. */
  total: number | null;
  /** Null when there is nothing left to read (the partial already holds the whole file). */
  body: Readable | null;
  /** Where the bytes come from after redirects, for messages. */
  url: string;
}

export interface HttpSourceSettings {
  dispatcher: Dispatcher;
  headersTimeoutMs: number;
  bodyTimeoutMs: number;
  /** Which headers survive a redirect. */
  headersForRedirect: (headers: Record<string, string>, from: string, to: string) => Record<string, string>;
  /**
   * How this caller names a refusal of the source (a status other than 200, 206 and 416),
   * or null for the mirror's own wording. A node fetching from the server's mirror says
   * what a 401 or a 404 means there, not what it means at the Hub.
   */
  statusError?: (answer: SourceStatus) => LlmgwError | null;
}

/** A source's refusal: its status, the file, where it answered, and the start of what it said. */
export interface SourceStatus {
  status: number;
  spec: MirrorFetchFile;
  url: string;
  /** The first few hundred characters of the answer's body, when it had one. */
  said: string | undefined;
}

const MAX_REDIRECTS = 5;

/** Opens the bytes of `spec` from `offset` over HTTP. Transport failures reject as `SourceError`. */
export async function openHttpSource(spec: MirrorFetchFile, offset: number, signal: AbortSignal, settings: HttpSourceSettings): Promise<Source> {
  const followed = await followRedirects({
    url: spec.url,
    headers: {
      ...(spec.headers ?? {}),
      // Compressed bodies would hash differently from the published sha256.
      "accept-encoding": "identity",
      ...(offset > 0 ? { range: `bytes=${offset}-` } : {}),
    },
    maxRedirects: MAX_REDIRECTS,
    // The registry's token must not reach another host (the CDN gets a signed URL).
    headersForRedirect: settings.headersForRedirect,
    send: async (url, headers) => {
      try {
        return await request(url, {
          dispatcher: settings.dispatcher,
          method: "GET",
          headers,
          headersTimeout: settings.headersTimeoutMs,
          bodyTimeout: settings.bodyTimeoutMs,
          highWaterMark: 1024 * 1024,
          signal,
        });
      } catch (error) {
        throw new SourceError(error, url);
      }
    },
  });
  const { response, url: current } = followed;
  if (followed.redirect !== null) {
    await response.body.dump().catch(() => undefined);
    if (followed.redirect.protocol !== "http:" && followed.redirect.protocol !== "https:") {
      throw new UpstreamError(`The source of '${spec.path}' redirected to a ${followed.redirect.protocol} URL; only http and https are followed.`, {
        code: "mirror_bad_redirect",
      });
    }
    throw new UpstreamError(`The source of '${spec.path}' redirected more than ${MAX_REDIRECTS} times (last: ${origin(current)}).`, {
      code: "mirror_too_many_redirects",
    });
  }
  const status = response.statusCode;
  if (status === 200) {
    return { start: 0, total: contentLength(response.headers), body: response.body, url: current };
  }
  if (status === 206) {
    const range = parseContentRange(header(response.headers, "content-range"));
    if (range === null) {
      response.body.destroy();
      throw new MirrorTransientError(`The source of '${spec.path}' at ${origin(current)} answered 206 without a usable Content-Range.`, {
        code: "mirror_bad_range",
        restartFromZero: true,
      });
    }
    return { start: range.start, total: range.total, body: response.body, url: current };
  }
  if (status === 416) {
    await response.body.dump().catch(() => undefined);
    const total = parseUnsatisfiedRange(header(response.headers, "content-range"));
    // Asked from exactly the end: the partial already holds the whole file.
    if (total !== null && total === offset) return { start: offset, total, body: null, url: current };
    throw new MirrorTransientError(
      `The source of '${spec.path}' refused the range from byte ${offset}${total === null ? "" : ` (it has ${total} bytes)`}; starting the file over.`,
      { code: "mirror_bad_range", restartFromZero: true },
    );
  }
  const said = await errorText(response.body);
  throw settings.statusError?.({ status, spec, url: current, said }) ?? sourceStatusError(status, spec, current, said);
}

function sourceStatusError(status: number, spec: MirrorFetchFile, url: string, said: string | undefined): LlmgwError {
  const where = origin(url);
  const detail = said === undefined ? "" : ` It said: ${said}`;
  if (status === 401 || status === 403) {
    return new UpstreamError(
      `The source at ${where} refused '${spec.path}' (${status}): the repository may be gated or private, and the HF_TOKEN in the llmgw server's environment is missing or lacks access. Set HF_TOKEN to a token with access where the server runs (not for ctl), restart the server, and fetch again.${detail}`,
      { code: "mirror_source_forbidden" },
    );
  }
  if (status === 404) {
    return new UpstreamError(
      `The source at ${where} has no '${spec.path}' (404); the repository may have changed. Read it again and fetch the new file list.${detail}`,
      {
        code: "mirror_source_not_found",
      },
    );
  }
  if (status === 408 || status === 429 || status >= 500) {
    return new MirrorTransientError(
      `The source at ${where} answered ${status} for '${spec.path}'.${detail} It is retryable: fetching again resumes from the bytes already on disk.`,
      {
        code: "mirror_source_error",
        status: 502,
      },
    );
  }
  return new UpstreamError(`The source at ${where} answered ${status} for '${spec.path}'.${detail}`, { code: "mirror_source_error" });
}

function header(headers: Record<string, string | string[] | undefined>, name: string): string | undefined {
  const value = headers[name];
  return Array.isArray(value) ? value.join(", ") : value;
}

function contentLength(headers: Record<string, string | string[] | undefined>): number | null {
  const value = header(headers, "content-length");
  return value !== undefined && /^\d+$/.test(value) ? Number(value) : null;
}

/** `bytes a-b/total` (total may be `*`). */
function parseContentRange(value: string | undefined): { start: number; total: number | null } | null {
  const match = /^bytes\s+(\d+)-(\d+)\/(\d+|\*)$/i.exec(value?.trim() ?? "");
  if (match === null) return null;
  return { start: Number(match[1]), total: match[3] === "*" ? null : Number(match[3]) };
}

/** The size in a 416's `bytes * /total`. */
function parseUnsatisfiedRange(value: string | undefined): number | null {
  const match = /^bytes\s+\*\/(\d+)$/i.exec(value?.trim() ?? "");
  return match === null ? null : Number(match[1]);
}

/** The first few hundred characters of an error answer. */
async function errorText(body: Readable): Promise<string | undefined> {
  try {
    const chunks: Buffer[] = [];
    let total = 0;
    for await (const chunk of body) {
      chunks.push(chunk as Buffer);
      total += (chunk as Buffer).length;
      if (total >= 4096) {
        body.destroy();
        break;
      }
    }
    const text = Buffer.concat(chunks).toString("utf8").trim().slice(0, 300);
    // biome-ignore lint/suspicious/noControlCharactersInRegex: it matches control characters so that they are stripped from an untrusted server's error text.
    return text === "" ? undefined : text.replace(/[\u0000-\u001f\u007f]/g, " ");
  } catch {
    return undefined;
  }
}
