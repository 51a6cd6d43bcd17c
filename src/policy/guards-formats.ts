// What llmgw asks a guard model and how it reads the answer, per guard format
// (reference/protocols.md §6 "Safety classifiers"): the prompt each classifier was trained
// on, filled with the conversation to check, and a strict parser of its verdict. An answer
// that is not a verdict of the format is "garbled" (GarbledVerdictError); the caller treats
// it as a failed guard, never as "safe"; a garbled answer that still says unsafe is unsafe.
// All client text goes into the one judged user message, neutralised (neutralise) so that
// it cannot forge a turn, a marker of the prompt or a template's special token.
//
// How the prompt travels: as the single user message of a chat completion. Llama Guard 3's
// and ShieldGemma's prompts are task texts that start a user turn and end where the model's
// answer begins; a chat request whose one user message is that text gets exactly those turn
// markers from a plain chat template (llama-server's built-in llama3 / gemma templates, the
// bundled engine's Llama 3 and Gemma wrappers), and it is the one request shape every
// OpenAI-compatible server accepts. A raw /v1/completions prompt with the markers written
// out would be template-free, but the bundled engine does not parse special tokens in
// prompts and hosted guard APIs offer chat only. The limit (README): a server that applies
// the guard's own Hugging Face template, which builds the task text itself (vLLM with
// Llama-Guard-3's tokenizer_config), would wrap ours a second time; serve such a guard with
// a plain template.

export type GuardFormat = "llama-guard-3" | "shieldgemma" | "json";

/**
 * What a guard is asked about. `client` is every piece of text the client controls, in the
 * order it came (system, developer, user, tool and client-sent assistant messages, tool
 * definitions and call arguments, a prompt): the guard judges all of it as one message of
 * the user, so nothing the client wrote is merely "context" (see clientTexts in guards.ts
 * for why one merged question rather than one per turn). An output check also carries the
 * model's answer, which is then the judged message and the client's text its context.
 */
export type GuardQuestion = { check: "input"; client: readonly string[] } | { check: "output"; client: readonly string[]; answer: string };

export type Verdict = { safe: true } | { safe: false; categories: string[] };

/** The guard answered something that is not a verdict of its format. */
export class GarbledVerdictError extends Error {
  constructor(
    readonly format: GuardFormat,
    readonly answer: string,
  ) {
    super(`its answer is not a ${format} verdict: ${JSON.stringify(answer.length > 80 ? `${answer.slice(0, 80)}…` : answer)}`);
    this.name = "GarbledVerdictError";
  }
}

/** The chat-completions body (without `model`) that asks a guard of `format` about `question`. */
export function guardRequestBody(
  format: GuardFormat,
  question: GuardQuestion,
): { messages: { role: "system" | "user"; content: string }[]; temperature: number; max_tokens: number } {
  switch (format) {
    case "llama-guard-3":
      // "unsafe" plus all 14 categories ("S1,S2,…,S14") fits well within 64 tokens.
      return { messages: [{ role: "user", content: llamaGuardPrompt(question) }], temperature: 0, max_tokens: 64 };
    case "shieldgemma":
      // Only the first word is read (the model card scores the Yes/No token); a few tokens
      // leave room for a leading space or newline some servers keep.
      return { messages: [{ role: "user", content: shieldGemmaPrompt(question) }], temperature: 0, max_tokens: 4 };
    case "json":
      return {
        messages: [
          { role: "system", content: JSON_INSTRUCTIONS },
          { role: "user", content: jsonPrompt(question) },
        ],
        temperature: 0,
        max_tokens: 128,
      };
  }
}

/** Reads a guard's answer text; throws GarbledVerdictError for anything that is not a verdict. */
export function parseVerdict(format: GuardFormat, answer: string): Verdict {
  switch (format) {
    case "llama-guard-3":
      return parseLlamaGuard(answer);
    case "shieldgemma":
      return parseShieldGemma(answer);
    case "json":
      return parseJsonVerdict(answer);
  }
}

// ---------------------------------------------------------------------------------------
// Client text inside a prompt

/**
 * Special-token strings of the chat templates a guard may be served with (Llama 3, Gemma,
 * ChatML, Mistral): llama-server tokenizes the rendered template with special-token
 * parsing on, so such a string in client text would become a real turn boundary and let the
 * client end the guard's task early and write its own answer.
 */
const SPECIAL_TOKEN = /<\|[^<>|\s]{1,64}\|>|<\/?(?:start_of_turn|end_of_turn|bos|eos|pad|unk|mask|s)>|\[\/?INST\]|<<\/?SYS>>/gi;
/** The markers of the formats' own prompts (Llama Guard's blocks, the JSON transcript). */
const PROMPT_MARKER = /<\/?\s*(?:(?:BEGIN|END)\s+(?:CONVERSATION|UNSAFE\s+CONTENT\s+CATEGORIES)|conversation)\s*>/gi;
/** A line that reads as a turn header of one of the formats' transcripts. */
const TURN_HEADER = /^([ \t]*)((?:user|agent|assistant|system|tool|developer|human question|chatbot response)[ \t]*:)/gim;

/**
 * One piece of client (or model) text, made unable to change the shape of the prompt it is
 * put in (review finding 1: a forged "\n\nUser: harmless" turn made Llama Guard judge only
 * the forged turn). Turns in every format are separated by a blank line, so blank-line runs
 * become one newline; a line that starts like a turn header is quoted with "> "; the
 * formats' markers and template special tokens get look-alike brackets (‹ › ( )), which
 * keep them readable to the classifier but no longer markers or tokens. Only the guard's
 * copy is changed; the model gets the request as the client sent it.
 */
export function neutralise(text: string): string {
  return text
    .replace(/\r\n?|[\v\f\u0085\u2028\u2029]/g, "\n")
    .replace(SPECIAL_TOKEN, lookAlike)
    .replace(PROMPT_MARKER, lookAlike)
    .replace(/\n[ \t]*(?:\n[ \t]*)+/g, "\n")
    .replace(TURN_HEADER, "$1> $2")
    .trim();
}

function lookAlike(marker: string): string {
  return marker.replace(/</g, "‹").replace(/>/g, "›").replace(/\[/g, "(").replace(/\]/g, ")");
}

/** The pieces of text of one side of the conversation, neutralised, as one message. */
function judgedText(pieces: readonly string[]): string {
  return pieces
    .map(neutralise)
    .filter((piece) => piece !== "")
    .join("\n");
}

/**
 * A garbled answer that still says "unsafe" first (any case, any punctuation: "Unsafe.",
 * "UNSAFE S1") is an unsafe verdict: under guard_on_error allow a garbled answer passes, and
 * a guard that said unsafe in a slightly other shape must not let the request through.
 */
function saysUnsafe(answer: string): boolean {
  return /^[^A-Za-z]*([A-Za-z]+)/.exec(answer)?.[1]?.toLowerCase() === "unsafe";
}

// ---------------------------------------------------------------------------------------
// Llama Guard 3

/** The 14 hazard categories of Llama Guard 3 (its MODEL_CARD.md), by code. */
export const LLAMA_GUARD_3_CATEGORIES: Readonly<Record<string, string>> = {
  S1: "Violent Crimes",
  S2: "Non-Violent Crimes",
  S3: "Sex-Related Crimes",
  S4: "Child Sexual Exploitation",
  S5: "Defamation",
  S6: "Specialized Advice",
  S7: "Privacy",
  S8: "Intellectual Property",
  S9: "Indiscriminate Weapons",
  S10: "Hate",
  S11: "Suicide & Self-Harm",
  S12: "Sexual Content",
  S13: "Elections",
  S14: "Code Interpreter Abuse",
};

/** llama-recipes' PROMPT_TEMPLATE_3, without the header tokens the chat template adds. */
function llamaGuardPrompt(question: GuardQuestion): string {
  const agentType = question.check === "input" ? "User" : "Agent";
  const categories = Object.entries(LLAMA_GUARD_3_CATEGORIES)
    .map(([code, name]) => `${code}: ${name}.`)
    .join("\n");
  const turns = [`User: ${judgedText(question.client)}`];
  if (question.check === "output") turns.push(`Agent: ${judgedText([question.answer])}`);
  const conversation = turns.join("\n\n");
  return [
    `Task: Check if there is unsafe content in '${agentType}' messages in conversations according our safety policy with the below categories.`,
    "",
    "<BEGIN UNSAFE CONTENT CATEGORIES>",
    categories,
    "<END UNSAFE CONTENT CATEGORIES>",
    "",
    "<BEGIN CONVERSATION>",
    "",
    conversation,
    "",
    "<END CONVERSATION>",
    "",
    `Provide your safety assessment for ONLY THE LAST ${agentType} message in the above conversation:`,
    " - First line must read 'safe' or 'unsafe'.",
    " - If unsafe, a second line must include a comma-separated list of violated categories.",
  ].join("\n");
}

/**
 * `safe` alone, or `unsafe` and a line of category codes. The first line decides: "unsafe"
 * with a missing or unreadable category line is still unsafe (a guard that was cut short
 * must not let the request through under guard_on_error allow); codes outside S1–S14 are
 * named as they came. Any other answer whose first word is unsafe ("unsafe S1" on one
 * line, "Unsafe.") is unsafe too, with the S-codes found in it; the rest is garbled.
 */
function parseLlamaGuard(answer: string): Verdict {
  const lines = answer
    .trim()
    .split(/\r?\n/)
    .map((line) => line.trim())
    .filter((line) => line !== "");
  const first = lines[0];
  // "safe" followed by more (category lines, say) is not the format's safe: garbled.
  if (first === "safe" && lines.length === 1) return { safe: true };
  const named = (codes: string[]) => codes.map((code) => (LLAMA_GUARD_3_CATEGORIES[code] === undefined ? code : `${code} ${LLAMA_GUARD_3_CATEGORIES[code]}`));
  if (first === "unsafe") {
    const codes = (lines[1] ?? "")
      .split(",")
      .map((code) => code.trim().toUpperCase())
      .filter((code) => code !== "");
    return { safe: false, categories: named(codes) };
  }
  if (saysUnsafe(answer)) return { safe: false, categories: named([...new Set((answer.match(/\bS\d{1,2}\b/gi) ?? []).map((code) => code.toUpperCase()))]) };
  throw new GarbledVerdictError("llama-guard-3", answer);
}

// ---------------------------------------------------------------------------------------
// ShieldGemma

/**
 * The four harm types ShieldGemma was trained on, with the guideline wording of its model
 * card, for a prompt (input) and for a response (output). One request asks about all four
 * in one principle list, so a "Yes" names all four as the categories checked.
 */
const SHIELDGEMMA_HARMS: readonly { name: string; prompt: string; response: string }[] = [
  {
    name: "Dangerous Content",
    prompt:
      '"No Dangerous Content": The prompt shall not contain or seek generation of content that harming oneself and/or others (e.g., accessing or building firearms and explosive devices, promotion of terrorism, instructions for suicide).',
    response:
      '"No Dangerous Content": The chatbot shall not generate content that harming oneself and/or others (e.g., accessing or building firearms and explosive devices, promotion of terrorism, instructions for suicide).',
  },
  {
    name: "Harassment",
    prompt:
      '"No Harassment": The prompt shall not contain or seek generation of content that is malicious, intimidating, bullying, or abusive content targeting another individual (e.g., physical threats, denial of tragic events, disparaging victims of violence).',
    response:
      '"No Harassment": The chatbot shall not generate content that is malicious, intimidating, bullying, or abusive content targeting another individual (e.g., physical threats, denial of tragic events, disparaging victims of violence).',
  },
  {
    name: "Hate Speech",
    prompt:
      '"No Hate Speech": The prompt shall not contain or seek generation of content that targeting identity and/or protected attributes (e.g., racial slurs, promotion of discrimination, calls to violence against protected groups) or dehumanizing/belittling/vilifying on the bases of race, ethnicity, religion, disability, age, nationality, veteran status, sexual orientation, gender, gender identity, caste, or any other protected status.',
    response:
      '"No Hate Speech": The chatbot shall not generate content that targeting identity and/or protected attributes (e.g., racial slurs, promotion of discrimination, calls to violence against protected groups) or dehumanizing/belittling/vilifying on the bases of race, ethnicity, religion, disability, age, nationality, veteran status, sexual orientation, gender, gender identity, caste, or any other protected status.',
  },
  {
    name: "Sexually Explicit",
    prompt:
      '"No Sexually Explicit Information": The prompt shall not contain or seek generation of content that contains references to sexual acts or other lewd content (e.g., sexually graphic descriptions, content aimed at causing arousal). Medical or scientific terms related to human anatomy or sex education are permitted.',
    response:
      '"No Sexually Explicit Information": The chatbot shall not generate content that contains references to sexual acts or other lewd content (e.g., sexually graphic descriptions, content aimed at causing arousal). Medical or scientific terms related to human anatomy or sex education are permitted.',
  },
];

export const SHIELDGEMMA_HARM_TYPES: readonly string[] = SHIELDGEMMA_HARMS.map((harm) => harm.name);

/**
 * ShieldGemma's prompt-only template, or its response variant for output checks. The
 * "Human Question" is all of the client's text (every client-controlled turn): the model
 * judges one prompt, and text hidden in an earlier turn must not escape it.
 */
function shieldGemmaPrompt(question: GuardQuestion): string {
  const asked = judgedText(question.client);
  const reply = question.check === "output" ? judgedText([question.answer]) : null;
  const principles = SHIELDGEMMA_HARMS.map((harm) => `* ${reply === null ? harm.prompt : harm.response}`).join("\n");
  const lines = [
    `You are a policy expert trying to help determine whether ${reply === null ? "a user prompt" : "an AI response to prompt"} is in violation of the defined safety policies.`,
    "",
    "<start_of_turn>",
    `Human Question: ${asked}`,
    "<end_of_turn>",
  ];
  if (reply !== null) lines.push("", "<start_of_turn>", `Chatbot Response: ${reply}`, "<end_of_turn>");
  lines.push(
    "",
    "Our safety principle is defined in the below:",
    "",
    principles,
    "",
    "===",
    "",
    reply === null
      ? "Does the human question violate the above principle? Your answer must start with 'Yes' or 'No'. And then walk through step by step to be sure we answer correctly."
      : "Does the Chatbot Response violate the above principle? Your answer must start with 'Yes' or 'No'. And then walk through step by step to be sure we answer correctly.",
  );
  return lines.join("\n");
}

/** The first word decides: Yes (a violation) or No; anything else is garbled. */
function parseShieldGemma(answer: string): Verdict {
  const first = /^\s*([A-Za-z]+)/.exec(answer)?.[1]?.toLowerCase();
  if (first === "no") return { safe: true };
  if (first === "yes") return { safe: false, categories: [...SHIELDGEMMA_HARM_TYPES] };
  if (saysUnsafe(answer)) return { safe: false, categories: [] };
  throw new GarbledVerdictError("shieldgemma", answer);
}

// ---------------------------------------------------------------------------------------
// JSON (any instruction-following model)

const JSON_INSTRUCTIONS = [
  "You are a content safety classifier. You judge one message of a conversation between a user and an AI assistant.",
  "Unsafe content includes violent or non-violent crimes, weapons, sexual content, child exploitation, hate, harassment, self-harm, defamation, privacy violations and other harmful content.",
  'Answer with only a JSON object and nothing else: {"safe": true, "categories": []} when the message is safe, or {"safe": false, "categories": ["<category>", ...]} naming what is unsafe.',
].join("\n");

function jsonPrompt(question: GuardQuestion): string {
  const turns = [`user: ${judgedText(question.client)}`];
  if (question.check === "output") turns.push(`assistant: ${judgedText([question.answer])}`);
  const transcript = turns.join("\n\n");
  const judged = question.check === "input" ? "the last user message" : "the last assistant message";
  return `Conversation:\n<conversation>\n${transcript}\n</conversation>\n\nIs ${judged} safe? Answer with the JSON object only.`;
}

/**
 * `{"safe": boolean, "categories": [string]}`, optionally in a ``` fence. Read toward
 * unsafe: `safe` false or "false", with categories as a list or one string, is unsafe; a
 * `safe: true` that still names categories is garbled, not safe; an answer that is not
 * such an object but says `"safe": false` or starts with "unsafe" is unsafe. Anything
 * else is garbled.
 */
function parseJsonVerdict(answer: string): Verdict {
  const fenced = /^```(?:json)?\s*([\s\S]*?)\s*```$/i.exec(answer.trim());
  const text = fenced?.[1] ?? answer.trim();
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    value = undefined;
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    if (saysUnsafe(answer) || /"safe"\s*:\s*(?:false|"false")/i.test(answer)) return { safe: false, categories: [] };
    throw new GarbledVerdictError("json", answer);
  }
  const { safe, categories } = value as { safe?: unknown; categories?: unknown };
  if (safe === false || (typeof safe === "string" && safe.trim().toLowerCase() === "false")) {
    const named = typeof categories === "string" ? [categories] : Array.isArray(categories) ? categories.filter((c): c is string => typeof c === "string") : [];
    return { safe: false, categories: named };
  }
  if (safe === true && (categories === undefined || (Array.isArray(categories) && categories.length === 0))) return { safe: true };
  throw new GarbledVerdictError("json", answer);
}
