// The console's one way to the admin API: same-origin requests that carry the session
// cookie (the browser never sees a key), JSON in and out, and errors turned into ApiError
// with the server's own message. It also keeps the connection state the header shows:
// a request that cannot reach the server marks the connection lost, the next that does
// marks it back.

export class ApiError extends Error {
  constructor(status, message, code) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

const connectionListeners = new Set();
let connectionState = { online: true, since: Date.now() };

/** The connection as the pages see it: { online, since }. */
export function connection() {
  return connectionState;
}

export function onConnectionChange(listener) {
  connectionListeners.add(listener);
  return () => connectionListeners.delete(listener);
}

export function markConnection(online) {
  if (connectionState.online === online) return;
  connectionState = { online, since: Date.now() };
  for (const listener of connectionListeners) listener(connectionState);
}

let sessionEnded = () => {};
/** Called with the server's message when a request finds the session over (expired, logged out, key revoked). */
export function whenSessionEnds(callback) {
  sessionEnded = callback;
}

/** For a request made without api() (the Playground's stream) that found the session over. */
export function endSession(message) {
  sessionEnded(message);
}

/**
 * GET (no body) or another method with a JSON body. Resolves to the parsed answer; throws
 * ApiError (status 0 when the server could not be reached) or the AbortError of `signal`.
 */
export async function api(path, { method = "GET", body, signal } = {}) {
  let response;
  try {
    response = await fetch(path, {
      method,
      credentials: "same-origin",
      headers: body === undefined ? { accept: "application/json" } : { accept: "application/json", "content-type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
    });
  } catch (error) {
    if (error?.name === "AbortError") throw error;
    markConnection(false);
    throw new ApiError(0, "The llmgw server cannot be reached. The console retries by itself.", "unreachable");
  }
  markConnection(true);
  const text = await response.text();
  let data = null;
  try {
    data = text === "" ? null : JSON.parse(text);
  } catch {
    data = null;
  }
  if (!response.ok) {
    const error = data?.error ?? {};
    const message = typeof error.message === "string" ? error.message : `The server answered ${response.status}.`;
    if (response.status === 401 && path !== "/api/v1/session") sessionEnded(message);
    throw new ApiError(response.status, message, error.code);
  }
  return data;
}

/** A query string from an object, leaving out empty values. */
export function query(params) {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") search.set(name, String(value));
  }
  const text = search.toString();
  return text === "" ? "" : `?${text}`;
}
