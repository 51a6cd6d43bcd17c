// What llmgw asks a guard model and how it reads the answer, per guard format
// (reference/protocols.md §6 "Safety classifiers"): the prompt each classifier was trained
// on, filled with the conversation to check, and a strict parser of its verdict. An answer
// that is not a verdict of the format is "garbled" (GarbledVerdictError); the caller treats
// it as a failed guard, never as "safe".
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

/** One turn of the conversation a guard looks at: the client's side or the model's. */
export interface Turn {
  role: "user" | "assistant";
  text: string;
}

/**
 * What a guard is asked about: the conversation, and whether the last user turn (input,
 * before a model answered) or the last assistant turn (output, the answer) is judged.
 */
export interface GuardQuestion {
  turns: readonly Turn[];
  check: "input" | "output";
}

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
export function guardRequestBody(format: GuardFormat, question: GuardQuestion): { messages: { role: "system" | "user"; content: string }[]; temperature: number; max_tokens: number } {
  switch (format) {
    case "llama-guard-3":
      // "unsafe" plus all 14 categories ("S1,S2,…,S14") fits well within 64 tokens.
      return { messages: [{ role: "user", content: llamaGuardPrompt(question) }], temperature: 0, max_tokens: 64 };
    case "shieldgemma":
      // Only the first word is read (the model card scores the Yes/No token); a few tokens
      // leave room for a leading space or newline some servers keep.
      return { messages: [{ role: "user", content: shieldGemmaPrompt(question) }], temperature: 0, max_tokens: 4 };
    case "json":
      return { messages: [{ role: "system", content: JSON_INSTRUCTIONS }, { role: "user", content: jsonPrompt(question) }], temperature: 0, max_tokens: 128 };
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
  const conversation = question.turns.map((turn) => `${turn.role === "user" ? "User" : "Agent"}: ${turn.text.trim()}`).join("\n\n");
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
 * `safe`, or `unsafe` and a line of category codes. The first line decides: "unsafe" with a
 * missing or unreadable category line is still unsafe (a guard that was cut short must not
 * let the request through under guard_on_error allow); codes outside S1–S14 are named as
 * they came.
 */
function parseLlamaGuard(answer: string): Verdict {
  const lines = answer
    .trim()
    .split(/\r?\n/)
    .map((line) => line.trim())
    .filter((line) => line !== "");
  const first = lines[0];
  if (first === "safe") return { safe: true };
  if (first !== "unsafe") throw new GarbledVerdictError("llama-guard-3", answer);
  const codes = (lines[1] ?? "")
    .split(",")
    .map((code) => code.trim().toUpperCase())
    .filter((code) => code !== "");
  return { safe: false, categories: codes.map((code) => (LLAMA_GUARD_3_CATEGORIES[code] === undefined ? code : `${code} ${LLAMA_GUARD_3_CATEGORIES[code]}`)) };
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
    prompt: '"No Dangerous Content": The prompt shall not contain or seek generation of content that harming oneself and/or others (e.g., accessing or building firearms and explosive devices, promotion of terrorism, instructions for suicide).',
    response: '"No Dangerous Content": The chatbot shall not generate content that harming oneself and/or others (e.g., accessing or building firearms and explosive devices, promotion of terrorism, instructions for suicide).',
  },
  {
    name: "Harassment",
    prompt: '"No Harassment": The prompt shall not contain or seek generation of content that is malicious, intimidating, bullying, or abusive content targeting another individual (e.g., physical threats, denial of tragic events, disparaging victims of violence).',
    response: '"No Harassment": The chatbot shall not generate content that is malicious, intimidating, bullying, or abusive content targeting another individual (e.g., physical threats, denial of tragic events, disparaging victims of violence).',
  },
  {
    name: "Hate Speech",
    prompt: '"No Hate Speech": The prompt shall not contain or seek generation of content that targeting identity and/or protected attributes (e.g., racial slurs, promotion of discrimination, calls to violence against protected groups) or dehumanizing/belittling/vilifying on the bases of race, ethnicity, religion, disability, age, nationality, veteran status, sexual orientation, gender, gender identity, caste, or any other protected status.',
    response: '"No Hate Speech": The chatbot shall not generate content that targeting identity and/or protected attributes (e.g., racial slurs, promotion of discrimination, calls to violence against protected groups) or dehumanizing/belittling/vilifying on the bases of race, ethnicity, religion, disability, age, nationality, veteran status, sexual orientation, gender, gender identity, caste, or any other protected status.',
  },
  {
    name: "Sexually Explicit",
    prompt: '"No Sexually Explicit Information": The prompt shall not contain or seek generation of content that contains references to sexual acts or other lewd content (e.g., sexually graphic descriptions, content aimed at causing arousal). Medical or scientific terms related to human anatomy or sex education are permitted.',
    response: '"No Sexually Explicit Information": The chatbot shall not generate content that contains references to sexual acts or other lewd content (e.g., sexually graphic descriptions, content aimed at causing arousal). Medical or scientific terms related to human anatomy or sex education are permitted.',
  },
];

export const SHIELDGEMMA_HARM_TYPES: readonly string[] = SHIELDGEMMA_HARMS.map((harm) => harm.name);

/**
 * ShieldGemma's prompt-only template, or its response variant for output checks. The
 * "Human Question" is all of the client's text (system and user turns): the model judges
 * one prompt, and text hidden in an earlier turn must not escape it.
 */
function shieldGemmaPrompt(question: GuardQuestion): string {
  const asked = question.turns.filter((turn) => turn.role === "user").map((turn) => turn.text.trim());
  const reply = question.check === "output" ? question.turns.findLast((turn) => turn.role === "assistant")?.text.trim() ?? "" : null;
  const principles = SHIELDGEMMA_HARMS.map((harm) => `* ${reply === null ? harm.prompt : harm.response}`).join("\n");
  const lines = [
    `You are a policy expert trying to help determine whether ${reply === null ? "a user prompt" : "an AI response to prompt"} is in violation of the defined safety policies.`,
    "",
    "<start_of_turn>",
    `Human Question: ${asked.join("\n\n")}`,
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
  const transcript = question.turns.map((turn) => `${turn.role}: ${turn.text.trim()}`).join("\n\n");
  const judged = question.check === "input" ? "the last user message" : "the last assistant message";
  return `Conversation:\n<conversation>\n${transcript}\n</conversation>\n\nIs ${judged} safe? Answer with the JSON object only.`;
}

/** `{"safe": boolean, "categories": [string]}`, optionally in a ``` fence; anything else is garbled. */
function parseJsonVerdict(answer: string): Verdict {
  const fenced = /^```(?:json)?\s*([\s\S]*?)\s*```$/i.exec(answer.trim());
  const text = fenced?.[1] ?? answer.trim();
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw new GarbledVerdictError("json", answer);
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) throw new GarbledVerdictError("json", answer);
  const { safe, categories } = value as { safe?: unknown; categories?: unknown };
  if (typeof safe !== "boolean") throw new GarbledVerdictError("json", answer);
  if (categories !== undefined && !(Array.isArray(categories) && categories.every((c) => typeof c === "string"))) throw new GarbledVerdictError("json", answer);
  return safe ? { safe: true } : { safe: false, categories: (categories as string[] | undefined) ?? [] };
}
