// How pages stay current. usePoll reloads what a page shows every 2 s (and at once when an
// event arrives, for pages that ask), keeping what it last had while the server is away, so
// a lost connection shows as a banner instead of an empty page. The event stream is one
// shared EventSource for the whole console; it resumes after the last event it saw.
import { useEffect, useRef, useState } from "../vendor/preact-htm.js";
import { api, markConnection } from "./api.js";

export const POLL_MS = 2000;

/**
 * `load(signal)` returns a promise of the data; it runs now, every `intervalMs`, whenever
 * `deps` change, and on reload(). Returns { data, error, loading, reload }.
 */
export function usePoll(load, deps = [], { intervalMs = POLL_MS, reloadOnEvents = true } = {}) {
  const [state, setState] = useState({ data: null, error: null, loading: true });
  const loadRef = useRef(load);
  loadRef.current = load;
  const runRef = useRef(() => {});
  useEffect(() => {
    let stopped = false;
    let timer;
    let controller;
    let inFlight = false;
    const run = async () => {
      clearTimeout(timer);
      controller?.abort();
      controller = new AbortController();
      const signal = controller.signal;
      inFlight = true;
      try {
        const data = await loadRef.current(signal);
        if (!stopped && !signal.aborted) setState({ data, error: null, loading: false });
      } catch (error) {
        if (error?.name === "AbortError" || stopped) return;
        setState((previous) => ({ data: previous.data, error, loading: false }));
      } finally {
        if (!signal.aborted) inFlight = false;
      }
      if (!stopped && !signal.aborted) timer = setTimeout(run, intervalMs);
    };
    runRef.current = run;
    setState((previous) => ({ ...previous, loading: true }));
    void run();
    // A burst of events costs one reload, not one each; what a load on its way misses, the next poll (2 s) shows.
    const unsubscribe = reloadOnEvents
      ? onEvent(() => {
          if (!inFlight) void run();
        })
      : () => {};
    return () => {
      stopped = true;
      clearTimeout(timer);
      controller?.abort();
      unsubscribe();
    };
  }, deps);
  return { ...state, reload: () => runRef.current() };
}

/** Runs `action` (a promise-returning function) with busy and error state for a button or form. */
export function useAction() {
  const [state, setState] = useState({ busy: false, error: null, result: null });
  const run = async (action) => {
    setState({ busy: true, error: null, result: null });
    try {
      const result = await action();
      setState({ busy: false, error: null, result });
      return result;
    } catch (error) {
      setState({ busy: false, error, result: null });
      return undefined;
    }
  };
  return { ...state, run, clear: () => setState({ busy: false, error: null, result: null }) };
}

// ---- The shared event stream ----

const eventListeners = new Set();
let source = null;
let lastEventId = null;
let retryTimer;

function openStream() {
  const url = lastEventId === null ? "/api/v1/events/stream" : `/api/v1/events/stream?after=${encodeURIComponent(lastEventId)}`;
  source = new EventSource(url);
  source.onopen = () => markConnection(true);
  source.onmessage = (message) => {
    lastEventId = message.lastEventId || lastEventId;
    let event;
    try {
      event = JSON.parse(message.data);
    } catch {
      return;
    }
    for (const listener of eventListeners) listener(event);
  };
  source.onerror = () => {
    markConnection(false);
    // The browser retries by itself while the stream is only interrupted; once it gives up
    // (an error status), a new stream is opened from the last event seen.
    if (source.readyState === EventSource.CLOSED) {
      source = null;
      clearTimeout(retryTimer);
      retryTimer = setTimeout(() => {
        if (eventListeners.size > 0 && source === null) openStream();
      }, POLL_MS);
    }
  };
}

/** Calls `listener(event)` for each event as it is recorded; returns the unsubscribe. */
export function onEvent(listener) {
  eventListeners.add(listener);
  if (source === null) openStream();
  return () => eventListeners.delete(listener);
}

/** Closes the stream (at logout). */
export function closeEvents() {
  clearTimeout(retryTimer);
  source?.close();
  source = null;
  lastEventId = null;
}

/** The last `limit` events of the given kinds, newest first (GET /api/v1/events). */
export async function recentEvents({ kinds, since, limit = 100, signal } = {}) {
  const params = new URLSearchParams();
  if (kinds) params.set("kind", kinds);
  if (since) params.set("since", since);
  params.set("limit", String(limit));
  return (await api(`/api/v1/events?${params}`, { signal })).data;
}
