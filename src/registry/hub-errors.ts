// How the Hugging Face Hub says no, turned into llmgw errors: the one mapping of Hub error
// answers (status, `X-Error-Code`, `X-Error-Message`, the JSON error body) to messages that
// name the repository, revision or file and say what to do. Where the request ran matters
// for the token's advice: inside the server, HF_TOKEN belongs in the server's environment.
import type { Dispatcher } from "undici";
import { type LlmgwError, NotFoundError, PermissionDeniedError, UpstreamError } from "../core/errors.ts";
import { clause } from "../core/format.ts";

/** An answer of the Hub, as the client received it. */
export interface HubResponse {
  url: string;
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: Dispatcher.ResponseData["body"];
}

/** What a request is for, so errors can name the repository, revision and file. */
export interface HubRequestContext {
  what: string;
  repo: string;
  revision?: string;
  path?: string;
}

/** What the client knows that changes the advice. */
export interface HubClientFacts {
  endpoint: string;
  hasToken: boolean;
  /** The client runs inside the llmgw server (plan and mirror requests), not in ctl. */
  inServer: boolean;
}

/** The revision asked for when none is given. */
export const DEFAULT_REVISION = "main";

export async function hubStatusError(response: HubResponse, context: HubRequestContext, client: HubClientFacts): Promise<LlmgwError> {
  const { endpoint, hasToken, inServer } = client;
  const tokenOwner = () => (inServer ? "the llmgw server's" : "the");
  // How to give the client a token: where the request ran decides whose environment.
  const setToken = (which: string) =>
    inServer ? `set HF_TOKEN to ${which} in the environment of the llmgw server (not of ctl) and restart it` : `set HF_TOKEN to ${which}`;
  const hubCode = header(response.headers, "x-error-code");
  const bodyMessage = await errorBodyMessage(response);
  const hubMessage = header(response.headers, "x-error-message") ?? bodyMessage;
  const { repo } = context;
  const status = response.status;
  const said = hubMessage === undefined ? "" : ` The registry said: ${clause(hubMessage)}.`;
  if (hubMessage === "Access to this resource is disabled.") return disabledError(repo, endpoint);
  if (hubCode === "GatedRepo") {
    const why = hasToken ? `${tokenOwner()} HF_TOKEN is not on its approved list` : `no HF_TOKEN is set${inServer ? " in the llmgw server's environment" : ""}`;
    return new PermissionDeniedError(
      `Repository '${repo}' is gated and ${why}. Downloading it needs a Hugging Face token (HF_TOKEN) of an account with approved access: ` +
        `request access at ${endpoint}/${repo}, then ${setToken("that account's token")}.`,
      { code: "gated_repo", param: "repo" },
    );
  }
  if (hubCode === "RevisionNotFound") {
    return new NotFoundError(
      `Revision '${context.revision ?? DEFAULT_REVISION}' was not found in repository '${repo}' on ${endpoint}. Give an existing branch, tag or full commit sha.`,
      { code: "revision_not_found", param: "revision" },
    );
  }
  if (hubCode === "EntryNotFound") {
    return new NotFoundError(
      `File '${context.path ?? "?"}' was not found in repository '${repo}' at '${context.revision ?? DEFAULT_REVISION}' on ${endpoint}.`,
      {
        code: "entry_not_found",
        param: "file",
      },
    );
  }
  const repoMissing = hubCode === "RepoNotFound" || (status === 404 && hubCode === undefined);
  if (!hasToken && (status === 401 || repoMissing)) {
    // The Hub answers 401 to anonymous requests for missing, private and gated repositories alike.
    return new NotFoundError(
      `Repository '${repo}' was not found on ${endpoint}, or it is private: check the name, and if it is private, ${setToken("a token with access")}.`,
      { code: "repo_not_found", param: "repo" },
    );
  }
  if (repoMissing) {
    return new NotFoundError(
      `Repository '${repo}' was not found on ${endpoint}, or it is private and ${tokenOwner()} HF_TOKEN has no access to it. Check the name (owner/name).`,
      { code: "repo_not_found", param: "repo" },
    );
  }
  if (status === 401) {
    const fix = inServer
      ? "check that the token is valid; the server reads it from its environment at start, so change it there and restart the llmgw server"
      : "check that the token is valid";
    return new PermissionDeniedError(`The registry at ${endpoint} rejected ${tokenOwner()} HF_TOKEN while ${context.what} for '${repo}': ${fix}.${said}`, {
      code: "registry_token_rejected",
    });
  }
  if (status === 403) {
    return new PermissionDeniedError(`The registry at ${endpoint} refused ${context.what} for '${repo}' (403).${said}`, {
      code: "registry_forbidden",
      param: "repo",
    });
  }
  const retryable = status === 408 || status === 429 || status >= 500;
  const retryAfter = header(response.headers, "retry-after");
  return new UpstreamError(
    `The registry at ${endpoint} answered ${status} while ${context.what} for '${repo}'.${said}${retryable ? " It is retryable: try again later." : ""}`,
    {
      code: status === 429 ? "registry_rate_limited" : "registry_error",
      retryable,
      ...(retryAfter !== undefined && /^\d+$/.test(retryAfter) ? { headers: { "retry-after": retryAfter } } : {}),
    },
  );
}

export function disabledError(repo: string, endpoint: string): PermissionDeniedError {
  return new PermissionDeniedError(`Repository '${repo}' on ${endpoint} is disabled by the registry; pick another repository.`, {
    code: "repo_disabled",
    param: "repo",
  });
}

/** The `{"error": "..."}` message of an error answer, reading at most a few KiB of it. */
async function errorBodyMessage(response: HubResponse): Promise<string | undefined> {
  try {
    const chunks: Buffer[] = [];
    let total = 0;
    for await (const chunk of response.body) {
      const buffer = Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk as Uint8Array);
      chunks.push(buffer);
      total += buffer.length;
      if (total >= 8192) {
        response.body.destroy();
        break;
      }
    }
    const text = Buffer.concat(chunks).toString("utf8").slice(0, 2000);
    try {
      const parsed = JSON.parse(text) as unknown;
      if (typeof parsed === "object" && parsed !== null && "error" in parsed && typeof parsed.error === "string") return parsed.error.slice(0, 300);
    } catch {
      // Not JSON: fall through to the text itself.
    }
    const trimmed = text.trim();
    return trimmed === "" ? undefined : trimmed.slice(0, 300);
  } catch {
    return undefined;
  }
}

export function header(headers: Record<string, string | string[] | undefined>, name: string): string | undefined {
  const value = headers[name];
  if (Array.isArray(value)) return value.join(", ");
  return value;
}
