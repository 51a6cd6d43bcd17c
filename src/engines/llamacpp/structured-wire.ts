// The OpenAI wire shapes of structured outputs and tool calls on the bundled engine:
// response_format, tools, tool_choice and parallel_tool_calls in a chat request, the
// tool_calls of assistant messages and the tool messages that answer them, and the
// tool_calls of answers and stream deltas (shared/reference/protocols.md §4). Request
// fields become a `ChatStructure` (what the runner must enforce), with every JSON Schema
// already translated into the grammar's dialect (json-schema-grammar.ts), so a schema
// the grammar cannot enforce is a 400 before any generation starts.
import { randomBytes } from "node:crypto";
import type { GbnfJsonSchema } from "node-llama-cpp";
import { z } from "zod";
import { BadRequestError } from "../../core/errors.ts";
import { toGrammarSchema } from "./json-schema-grammar.ts";

// OpenAI's rule for function names.
const FUNCTION_NAME = /^[a-zA-Z0-9_-]{1,64}$/;

export const toolSchema = z.object({
  type: z.literal("function", { error: "only tools of type 'function' are supported by the bundled engine" }),
  function: z.object({
    name: z.string().regex(FUNCTION_NAME, "a function name is 1 to 64 letters, digits, underscores or dashes"),
    description: z.string().nullish(),
    parameters: z.record(z.string(), z.unknown()).nullish(),
    strict: z.boolean().nullish(),
  }),
});

export const toolChoiceSchema = z.union(
  [z.enum(["none", "auto", "required"]), z.object({ type: z.literal("function"), function: z.object({ name: z.string() }) })],
  { error: 'tool_choice must be \'none\', \'auto\', \'required\' or {"type":"function","function":{"name":...}}' },
);

export const responseFormatSchema = z.discriminatedUnion(
  "type",
  [
    z.object({ type: z.literal("text") }),
    z.object({ type: z.literal("json_object") }),
    z.object({
      type: z.literal("json_schema"),
      json_schema: z.object({
        name: z.string().regex(FUNCTION_NAME, "a schema name is 1 to 64 letters, digits, underscores or dashes"),
        description: z.string().nullish(),
        schema: z.record(z.string(), z.unknown()).nullish(),
        strict: z.boolean().nullish(),
      }),
    }),
  ],
  { error: "response_format type must be 'text', 'json_object' or 'json_schema'" },
);

export const toolCallSchema = z.object({
  id: z.string().min(1),
  type: z.literal("function", { error: "only tool calls of type 'function' are supported" }),
  function: z.object({ name: z.string(), arguments: z.string() }),
});

/** A function call the model made (or made earlier, in the history). */
export interface ToolCall {
  id: string;
  name: string;
  /** The arguments as JSON text, as OpenAI carries them. */
  arguments: string;
}

export interface ToolSpec {
  name: string;
  description?: string;
  /** The parameters in the grammar's dialect; undefined: the function takes none. */
  parameters?: GbnfJsonSchema;
}

/** What a chat request asks the runner to enforce beyond plain text. */
export interface ChatStructure {
  /** Undefined: free text. null: any JSON object. Otherwise the schema the answer satisfies. */
  json?: GbnfJsonSchema | null;
  tools?: {
    /** The functions the prompt documents: all the tools, whatever tool_choice says. */
    documented: ToolSpec[];
    /** The functions the model may call: none for tool_choice "none", one when it names one. */
    callable: ToolSpec[];
    /** Whether the reply must be a call (tool_choice "required" or a named function). */
    forced: boolean;
    /** parallel_tool_calls: false allows one call per reply. */
    parallel: boolean;
  };
}

interface StructureFields {
  tools?: Array<z.output<typeof toolSchema>> | null | undefined;
  tool_choice?: z.output<typeof toolChoiceSchema> | null | undefined;
  parallel_tool_calls?: boolean | null | undefined;
  response_format?: z.output<typeof responseFormatSchema> | null | undefined;
}

function fieldError(param: string, what: string): BadRequestError {
  return new BadRequestError(`Invalid request body: field '${param}': ${what}`, { code: "invalid_field", param });
}

function toolSpecs(tools: Array<z.output<typeof toolSchema>>): ToolSpec[] {
  const seen = new Set<string>();
  return tools.map((tool, index): ToolSpec => {
    const { name, description, parameters } = tool.function;
    if (seen.has(name)) throw fieldError(`tools.${index}.function.name`, `the function name '${name}' is used twice; give each tool its own name.`);
    seen.add(name);
    const path = `tools.${index}.function.parameters`;
    // A function's arguments are a JSON object (OpenAI says the same).
    if (parameters != null && parameters.type !== undefined && parameters.type !== "object") {
      throw fieldError(`${path}.type`, `a function's parameters must be a schema of type 'object', not ${JSON.stringify(parameters.type)}.`);
    }
    const schema = parameters == null ? undefined : toGrammarSchema({ ...parameters, type: "object" }, path);
    // An object that can hold nothing: the function takes no arguments, which LlamaChat
    // generates no grammar for (the call's arguments are then "{}").
    const empty = schema !== undefined && "properties" in schema && Object.keys(schema.properties ?? {}).length === 0 && !("additionalProperties" in schema);
    return { name, ...(description ? { description } : {}), ...(schema && !empty ? { parameters: schema } : {}) };
  });
}

/** The structure a chat body asks for; 400 for what the bundled engine cannot enforce. */
export function toChatStructure(body: StructureFields): ChatStructure {
  const structure: ChatStructure = {};
  const format = body.response_format;
  if (format?.type === "json_object") structure.json = null;
  if (format?.type === "json_schema") {
    const schema = format.json_schema.schema;
    structure.json = schema == null ? null : toGrammarSchema(schema, "response_format.json_schema.schema");
  }
  const tools = body.tools ?? [];
  const choice = body.tool_choice ?? (tools.length > 0 ? "auto" : "none");
  if (tools.length === 0) {
    if (choice === "required" || typeof choice === "object")
      throw fieldError("tool_choice", "asks for a tool call but the request has no tools; send 'tools' or drop 'tool_choice'.");
    return structure;
  }
  const specs = toolSpecs(tools);
  // tool_choice none: the model sees the tools (as with OpenAI) but answers in text.
  if (choice === "none") {
    structure.tools = { documented: specs, callable: [], forced: false, parallel: false };
    return structure;
  }
  if (structure.json !== undefined) {
    throw fieldError(
      "response_format",
      "the bundled engine cannot combine a JSON response_format with tool calls; send tool_choice 'none' or drop one of them.",
    );
  }
  let callable = specs;
  if (typeof choice === "object") {
    callable = specs.filter((spec) => spec.name === choice.function.name);
    if (callable.length === 0)
      throw fieldError(
        "tool_choice.function.name",
        `names '${choice.function.name}', which is not one of the tools; name one of: ${specs.map((s) => s.name).join(", ")}.`,
      );
  }
  structure.tools = { documented: specs, callable, forced: choice !== "auto", parallel: body.parallel_tool_calls !== false };
  return structure;
}

/** A new tool call id, in OpenAI's shape. */
export function newToolCallId(): string {
  return `call_${randomBytes(12).toString("hex")}`;
}

/** message.tool_calls of an answer. */
export function toolCallsField(calls: readonly ToolCall[]) {
  return calls.map((call) => ({ id: call.id, type: "function" as const, function: { name: call.name, arguments: call.arguments } }));
}

/** One stream delta of a tool call: the first carries id, type and name; later ones arguments. */
export type ToolCallDelta = { index: number; id: string; name: string } | { index: number; arguments: string };

export function toolCallDeltaField(delta: ToolCallDelta) {
  if ("id" in delta) return { index: delta.index, id: delta.id, type: "function" as const, function: { name: delta.name, arguments: "" } };
  return { index: delta.index, function: { arguments: delta.arguments } };
}
