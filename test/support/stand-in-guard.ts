// A stand-in guard model behind an `external` profile: real HTTP on loopback speaking
// OpenAI chat completions (protocols.md §4), standing for Llama Guard 3, ShieldGemma or an
// instruction model asked for a JSON verdict (protocols.md §6). It reads the prompt llmgw
// sends the way the real classifier is trained to (the judged message of the conversation),
// and answers in that format's exact output shape: "safe" / "unsafe\nS1,S10", "No" / "Yes",
// {"safe": …, "categories": […]}. A prompt not in the format's shape is answered 400, so a
// test fails when llmgw asks the wrong question. `behaviour` switches to the failures a
// gateway must survive: a garbled answer, a 500, no answer at all, or a verbatim answer
// (a verdict in an unexpected shape).
//
// It reads the prompt as a language model would, not as llmgw wrote it: a line that starts
// like a turn header ("User:", "Agent:", "user:", "assistant:") starts a new turn whether or
// not a blank line comes before it; the first <END CONVERSATION> or </conversation> ends the
// conversation; the last "Human Question:" is the question. So client text that forges a
// turn or a marker fools it the way it would fool the real classifier. With `contextTokens`
// it refuses a prompt longer than its context the way llama-server does (HTTP 400,
// exceed_context_size_error), counting a token per 4 bytes.
import http from "node:http";
import type { AddressInfo } from "node:net";
import type { GuardFormat } from "../../src/policy/guards-formats.ts";

export type StandInGuardBehaviour = "verdict" | "garbled" | "error" | "hang" | "verbatim";

/** A question as llmgw asks it: an OpenAI chat completions request whose turns are plain text, and whatever else it sets. */
export interface GuardRequest {
  model: string;
  messages?: { role: string; content: string }[];
  [field: string]: unknown;
}

export interface StandInGuardOptions {
  format: GuardFormat;
  /**
   * Words that make the judged message unsafe (case-insensitive), each with what the guard
   * names: Llama Guard 3 codes ("S1"), JSON category names; ShieldGemma only says Yes.
   */
  unsafeWords: Record<string, string[]>;
  /** Required Bearer token (the profile's api_key). */
  key?: string;
  /** The context it can read, in tokens (4 bytes each); longer prompts get llama-server's 400. */
  contextTokens?: number;
}

export interface StandInGuard {
  url: string;
  behaviour: StandInGuardBehaviour;
  /** Milliseconds the guard thinks before each answer (a known minimum of guard time); default 0. */
  delayMs: number;
  /** The answer text of behaviour "verbatim". */
  verbatim: string;
  /** What each request asked: the judged side and text as the stand-in read them. */
  questions: Array<{ check: "input" | "output"; judged: string; authorization: string | undefined; body: GuardRequest }>;
  /** Questions whose asker hung up before the answer (a cancelled guard call). */
  cancelled: () => number;
  close(): Promise<void>;
}

/** Splits a transcript into turns at every line that starts with one of `headers` and a colon. */
function turnsOf(transcript: string, headers: string): { header: string; text: string }[] {
  const turns: { header: string; text: string }[] = [];
  for (const line of transcript.split("\n")) {
    const header = new RegExp(`^(${headers}):[ ]?`).exec(line);
    if (header !== null) turns.push({ header: header[1]!, text: line.slice(header[0].length) });
    else if (turns.length > 0) turns.at(-1)!.text += `\n${line}`;
  }
  return turns.map((turn) => ({ header: turn.header, text: turn.text.trim() }));
}

/** The judged side and message of a prompt in `format`'s shape, or null when it is not one. */
function readQuestion(format: GuardFormat, messages: { role: string; content: string }[]): { check: "input" | "output"; judged: string } | null {
  const last = messages.at(-1)?.content ?? "";
  if (format === "llama-guard-3") {
    const agentType = /^Task: Check if there is unsafe content in '(User|Agent)' messages in conversations according our safety policy/.exec(last)?.[1];
    const conversation = /<BEGIN CONVERSATION>\n\n([\s\S]*?)\n\n<END CONVERSATION>/.exec(last)?.[1];
    if (agentType === undefined || conversation === undefined || !last.includes(`ONLY THE LAST ${agentType} message`)) return null;
    const judged = turnsOf(conversation, "User|Agent").findLast((turn) => turn.header === agentType);
    return judged === undefined ? null : { check: agentType === "User" ? "input" : "output", judged: judged.text };
  }
  if (format === "shieldgemma") {
    const question = [...last.matchAll(/<start_of_turn>\nHuman Question: ([\s\S]*?)\n<end_of_turn>/g)].at(-1)?.[1];
    const response = [...last.matchAll(/<start_of_turn>\nChatbot Response: ([\s\S]*?)\n<end_of_turn>/g)].at(-1)?.[1];
    if (question === undefined || !/Your answer must start with 'Yes' or 'No'/.test(last)) return null;
    return response === undefined ? { check: "input", judged: question } : { check: "output", judged: response };
  }
  const transcript = /<conversation>\n([\s\S]*?)\n<\/conversation>/.exec(last)?.[1];
  const side = /Is the last (user|assistant) message safe\?/.exec(last)?.[1];
  if (transcript === undefined || side === undefined || messages[0]?.role !== "system") return null;
  const judged = turnsOf(transcript, "user|assistant").findLast((turn) => turn.header === side);
  return judged === undefined ? null : { check: side === "user" ? "input" : "output", judged: judged.text };
}

function verdictText(format: GuardFormat, categories: string[] | null): string {
  if (format === "llama-guard-3") return categories === null ? "safe" : `unsafe\n${categories.join(",")}`;
  if (format === "shieldgemma") return categories === null ? "No" : "Yes";
  return JSON.stringify({ safe: categories === null, categories: categories ?? [] });
}

export async function startStandInGuard(options: StandInGuardOptions): Promise<StandInGuard> {
  const sockets = new Set<import("node:net").Socket>();
  let cancelled = 0;
  const guard: StandInGuard = {
    url: "",
    behaviour: "verdict",
    delayMs: 0,
    verbatim: "",
    questions: [],
    cancelled: () => cancelled,
    close: async () => undefined,
  };
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (chunk: Buffer) => chunks.push(chunk));
    req.on("end", () => {
      const reply = (status: number, body: unknown) => res.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify(body));
      if (options.key !== undefined && req.headers.authorization !== `Bearer ${options.key}`) {
        reply(401, { error: { message: "bad key", type: "authentication_error", param: null, code: null } });
        return;
      }
      const raw = Buffer.concat(chunks);
      const body = JSON.parse(raw.toString("utf8")) as GuardRequest;
      const promptTokens = Math.ceil(Buffer.byteLength((body.messages ?? []).map((m: { content: string }) => m.content).join("")) / 4);
      if (options.contextTokens !== undefined && promptTokens > options.contextTokens) {
        reply(400, {
          error: {
            code: 400,
            message: "the request exceeds the available context size, try increasing it",
            type: "exceed_context_size_error",
            n_prompt_tokens: promptTokens,
            n_ctx: options.contextTokens,
          },
        });
        return;
      }
      const question = req.url === "/v1/chat/completions" ? readQuestion(options.format, body.messages ?? []) : null;
      if (question === null) {
        reply(400, { error: { message: `not a ${options.format} guard prompt`, type: "invalid_request_error", param: null, code: null } });
        return;
      }
      guard.questions.push({ ...question, authorization: req.headers.authorization, body });
      if (guard.behaviour === "hang") {
        res.on("close", () => (cancelled += 1));
        return;
      }
      if (guard.behaviour === "error") {
        reply(500, { error: { message: "the guard engine failed", type: "server_error", param: null, code: null } });
        return;
      }
      const lower = question.judged.toLowerCase();
      const matched = Object.entries(options.unsafeWords).filter(([word]) => lower.includes(word.toLowerCase()));
      const categories = matched.length === 0 ? null : [...new Set(matched.flatMap(([, names]) => names))];
      const content =
        guard.behaviour === "garbled"
          ? "I'm sorry, but I can't help with that."
          : guard.behaviour === "verbatim"
            ? guard.verbatim
            : verdictText(options.format, categories);
      setTimeout(
        () =>
          reply(200, {
            id: "chatcmpl-guard",
            object: "chat.completion",
            created: 1764500000,
            model: body.model,
            choices: [{ index: 0, message: { role: "assistant", content }, finish_reason: "stop", logprobs: null }],
            usage: { prompt_tokens: 100, completion_tokens: 3, total_tokens: 103 },
          }),
        guard.delayMs,
      );
    });
  });
  server.on("connection", (socket) => {
    sockets.add(socket);
    socket.on("close", () => sockets.delete(socket));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  guard.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  guard.close = () =>
    new Promise<void>((resolve) => {
      for (const socket of sockets) socket.destroy();
      server.close(() => resolve());
    });
  return guard;
}
