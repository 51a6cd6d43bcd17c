// The Playground page: chat with any served model through the gateway, as an application
// would, with the answer streamed in token by token. The browser holds no API key: requests
// go to /api/v1/playground/chat/completions, which the server runs as the key that logged
// in (its usage, limits and guards apply). Shows time to first token and tokens per second,
// and a Stop button cuts the answer off.
import { html, useEffect, useRef, useState } from "../vendor/preact-htm.js";
import { api, endSession } from "../lib/api.js";
import { ErrorNote, formatNumber } from "../lib/ui.js";

const CHAT_PATH = "/api/v1/playground/chat/completions";
/** The reason a Clear aborts an answer with: nothing of it is shown afterwards. */
const CLEARED = "cleared";
let nextAnswerId = 0;

/** Reads a server-sent-events body and calls `onData` with each event's JSON ("[DONE]" ends it). */
async function readEventStream(body, onData) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    for (let boundary = buffer.search(/\r?\n\r?\n/); boundary !== -1; boundary = buffer.search(/\r?\n\r?\n/)) {
      const block = buffer.slice(0, boundary);
      buffer = buffer.slice(boundary).replace(/^\r?\n\r?\n/, "");
      const data = block
        .split(/\r?\n/)
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).trimStart())
        .join("\n");
      if (data === "") continue;
      if (data === "[DONE]") return;
      onData(JSON.parse(data));
    }
  }
}

/** The error of a refused request, in the server's own words. */
async function refusal(response) {
  try {
    const body = await response.json();
    if (typeof body?.error?.message === "string") return new Error(body.error.message);
  } catch {
    // Not JSON: say what happened in general terms below.
  }
  return new Error(`The server answered ${response.status}.`);
}

function Message({ message }) {
  const who = message.role === "user" ? "You" : (message.model ?? "Model");
  return html`<div class=${`msg msg-${message.role}`}>
    <span class="who">${who}:</span>
    <span class="text">${message.content}</span>
    ${message.stopped ? html` <em class="muted">(stopped)</em>` : null}
  </div>`;
}

function describeStats({ ttftMs, tokens, generationMs, finishReason }) {
  const parts = [];
  if (ttftMs !== null) parts.push(`time to first token ${formatNumber(ttftMs)} ms`);
  if (tokens > 0 && generationMs > 0) parts.push(`${formatNumber((tokens / generationMs) * 1000, 1)} tokens/s`);
  parts.push(`${tokens} token${tokens === 1 ? "" : "s"}`);
  if (finishReason) parts.push(`finished: ${finishReason}`);
  return parts.join(" · ");
}

export function PlaygroundPage() {
  const [models, setModels] = useState(null);
  const [modelsError, setModelsError] = useState(null);
  const [model, setModel] = useState("");
  const [text, setText] = useState("");
  const [maxTokens, setMaxTokens] = useState(256);
  // Empty: the model's own default sampling.
  const [temperature, setTemperature] = useState("");
  const [conversation, setConversation] = useState([]);
  const [streaming, setStreaming] = useState(false);
  const [error, setError] = useState(null);
  const [stats, setStats] = useState(null);
  const controller = useRef(null);
  const log = useRef(null);

  useEffect(() => {
    const aborter = new AbortController();
    api("/api/v1/models", { signal: aborter.signal })
      .then((answer) => {
        // Guard models judge requests; they are not for chatting.
        const names = answer.data.filter((entry) => entry.role !== "guard").map((entry) => entry.name);
        setModels(names);
        setModel((current) => current || names[0] || "");
      })
      .catch((failure) => {
        if (failure?.name !== "AbortError") setModelsError(failure);
      });
    return () => {
      aborter.abort();
      controller.current?.abort();
    };
  }, []);

  useEffect(() => {
    if (log.current) log.current.scrollTop = log.current.scrollHeight;
  }, [conversation]);

  const send = async (event) => {
    event.preventDefault();
    const content = text.trim();
    if (content === "" || model === "" || streaming) return;
    const history = [...conversation.map(({ role, content: said }) => ({ role, content: said })), { role: "user", content }];
    // Updates go to this answer by its id: a Clear while it streams leaves nothing to update.
    nextAnswerId += 1;
    const answer = { id: nextAnswerId, role: "assistant", content: "", model };
    setConversation([...history, answer]);
    setText("");
    setError(null);
    setStats(null);
    setStreaming(true);
    const aborter = new AbortController();
    controller.current = aborter;
    const sentAt = performance.now();
    let firstTokenAt = null;
    let tokens = 0;
    let reportedTokens = null;
    let finishReason = null;
    const update = (changes) => setConversation((current) => current.map((message) => (message.id === answer.id ? { ...message, ...changes } : message)));
    const finish = (stopped) => {
      if (aborter.signal.reason === CLEARED) return;
      const endedAt = performance.now();
      const counted = reportedTokens ?? tokens;
      const summary = describeStats({
        ttftMs: firstTokenAt === null ? null : firstTokenAt - sentAt,
        tokens: counted,
        generationMs: firstTokenAt === null ? 0 : endedAt - firstTokenAt,
        finishReason: stopped ? "stopped" : finishReason,
      });
      setStats(summary);
      if (stopped) update({ stopped: true });
    };
    try {
      const response = await fetch(CHAT_PATH, {
        method: "POST",
        credentials: "same-origin",
        headers: { "content-type": "application/json", accept: "text/event-stream" },
        body: JSON.stringify({
          model,
          messages: history,
          stream: true,
          stream_options: { include_usage: true },
          max_tokens: Number(maxTokens) || 256,
          ...(temperature === "" ? {} : { temperature: Number(temperature) }),
        }),
        signal: aborter.signal,
      });
      if (response.status === 401) {
        // The session ended elsewhere (logout in another tab, the key revoked): back to the login form.
        endSession((await refusal(response)).message);
        return;
      }
      if (!response.ok || response.body === null) throw await refusal(response);
      let said = "";
      await readEventStream(response.body, (chunk) => {
        if (chunk.error) throw new Error(chunk.error.message ?? "The model stopped with an error.");
        if (chunk.usage?.completion_tokens !== undefined) reportedTokens = chunk.usage.completion_tokens;
        const choice = chunk.choices?.[0];
        if (choice?.finish_reason) finishReason = choice.finish_reason;
        const piece = choice?.delta?.content;
        if (typeof piece === "string" && piece !== "") {
          if (firstTokenAt === null) firstTokenAt = performance.now();
          tokens += 1;
          said += piece;
          update({ content: said });
        }
      });
      finish(false);
    } catch (failure) {
      // Stop and Clear abort the request: the fetch or the read rejects with the abort's reason.
      if (aborter.signal.aborted) {
        finish(true);
      } else {
        setError(failure);
        // A request that never got an answer leaves no empty bubble behind.
        setConversation((current) => current.filter((message) => message.id !== answer.id || message.content !== ""));
      }
    } finally {
      controller.current = null;
      setStreaming(false);
    }
  };

  const stop = () => controller.current?.abort();
  const clear = () => {
    controller.current?.abort(CLEARED);
    setConversation([]);
    setStats(null);
    setError(null);
  };
  const onKeyDown = (event) => {
    // Enter sends, Shift+Enter makes a new line: what chat boxes do.
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      // send() catches its own failures and shows them on the page, so nothing waits for it here.
      void send(event);
    }
  };

  return html`<h1>Playground</h1>
    <p class="muted">Chat with a served model through the gateway, as your key. Requests count toward its usage and limits.</p>
    <${ErrorNote} error=${modelsError} prefix="Models could not be listed" />
    ${models !== null && models.length === 0 ? html`<p class="notice">No model is served yet. Serve one from the Jobs page.</p>` : null}
    <div class="log" role="log" aria-label="Conversation" aria-live="polite" aria-busy=${streaming ? "true" : "false"} ref=${log}>
      ${conversation.length === 0 ? html`<p class="muted">The conversation appears here.</p>` : conversation.map((message, index) => html`<${Message} key=${index} message=${message} />`)}
    </div>
    <p class="stats" role="status">${streaming ? "Answering…" : stats === null ? "" : `Last answer: ${stats}`}</p>
    <${ErrorNote} error=${error} />
    <form class="chat-form" onSubmit=${send}>
      <div class="form-grid">
        <div class="field">
          <label for="playground-model">Model</label>
          <select id="playground-model" value=${model} onChange=${(event) => setModel(event.currentTarget.value)} disabled=${models === null}>
            ${(models ?? []).map((name) => html`<option value=${name}>${name}</option>`)}
          </select>
        </div>
        <div class="field">
          <label for="playground-max-tokens">Max tokens</label>
          <input id="playground-max-tokens" type="number" min="1" max="32768" value=${maxTokens} onInput=${(event) => setMaxTokens(event.currentTarget.value)} />
        </div>
        <div class="field">
          <label for="playground-temperature">Temperature</label>
          <input id="playground-temperature" type="number" min="0" max="2" step="0.1" placeholder="model default" value=${temperature} onInput=${(event) => setTemperature(event.currentTarget.value)} />
        </div>
      </div>
      <div class="field">
        <label for="playground-message">Message</label>
        <textarea id="playground-message" rows="3" value=${text} onInput=${(event) => setText(event.currentTarget.value)} onKeyDown=${onKeyDown} placeholder="Say hello (Enter sends, Shift+Enter for a new line)"></textarea>
      </div>
      <div class="actions">
        <button type="submit" disabled=${streaming || model === "" || text.trim() === ""}>Send</button>
        <button type="button" class="secondary" onClick=${stop} disabled=${!streaming}>Stop</button>
        <button type="button" class="secondary" onClick=${clear} disabled=${conversation.length === 0}>Clear</button>
      </div>
    </form>`;
}
