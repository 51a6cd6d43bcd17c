// The translation of OpenAI JSON Schemas into node-llama-cpp's grammar dialect, the
// refusals of what the grammar cannot enforce, the bounded number rules, and the
// collection of streamed tool-call arguments; no model needed.
import { test } from "node:test";
import assert from "node:assert/strict";
import { z } from "zod";
import { zodResponseFormat } from "openai/helpers/zod";
import { BadRequestError } from "../../core/errors.ts";
import { rewriteGrammarRules } from "./grammar-rewrites.ts";
import { ToolCallCollector } from "./chat-tools.ts";
import { toGrammarSchema } from "./json-schema-grammar.ts";
import { toChatStructure, type ToolCallDelta, type ToolSpec } from "./structured-wire.ts";
import { ToolGrammarCheck } from "./tool-grammars.ts";
import type { Llama } from "node-llama-cpp";

const PATH = "response_format.json_schema.schema";

function refusal(schema: unknown): BadRequestError {
  try {
    toGrammarSchema(schema, PATH);
  } catch (error) {
    assert.ok(error instanceof BadRequestError, String(error));
    return error;
  }
  assert.fail(`expected ${JSON.stringify(schema)} to be refused`);
}

test("zod schemas from openai's zodResponseFormat translate: anyOf becomes oneOf, safe-integer bounds are accepted", () => {
  const format = zodResponseFormat(z.object({ n: z.number().int(), maybe: z.string().max(4).nullable(), kind: z.enum(["a", "b"]) }), "thing");
  const schema = toGrammarSchema(format.json_schema.schema, PATH);
  assert.deepEqual(schema, {
    type: "object",
    properties: {
      n: { type: "integer" },
      maybe: { oneOf: [{ type: "string", maxLength: 4 }, { type: "null" }] },
      kind: { enum: ["a", "b"] },
    },
  });
});

test("draft-7 definitions and $ref are rewritten to $defs; type lists with objects split into alternatives", () => {
  const schema = toGrammarSchema(
    {
      definitions: { leaf: { type: "boolean" } },
      type: "object",
      properties: { x: { $ref: "#/definitions/leaf" }, y: { type: ["object", "null"], properties: { z: { type: "integer" } } } },
    },
    PATH,
  );
  assert.deepEqual(schema, {
    type: "object",
    $defs: { leaf: { type: "boolean" } },
    properties: {
      x: { $ref: "#/$defs/leaf" },
      y: { oneOf: [{ type: "object", properties: { z: { type: "integer" } } }, { type: "null" }] },
    },
  });
  // A schema without type admits any value, which the grammar needs spelled out.
  assert.ok("oneOf" in toGrammarSchema({}, PATH));
});

test("keywords the grammar cannot enforce are refused with 400 naming the keyword and its path", () => {
  const cases: Array<[unknown, string, string]> = [
    [{ type: "object", properties: { age: { type: "string", pattern: "^a" } } }, `${PATH}.properties.age.pattern`, "'pattern'"],
    [{ type: "object", properties: { age: { type: "integer", minimum: 0 } } }, `${PATH}.properties.age.minimum`, "'minimum'"],
    [{ type: "array", items: { type: "number", multipleOf: 2 } }, `${PATH}.items.multipleOf`, "'multipleOf'"],
    [{ allOf: [{ type: "string" }] }, `${PATH}.allOf`, "'allOf'"],
    [{ type: "string", format: "email" }, `${PATH}.format`, "'format'"],
    [{ type: "array", uniqueItems: true }, `${PATH}.uniqueItems`, "'uniqueItems'"],
    [{ type: "object", properties: { a: { type: "string" } }, required: ["b"] }, `${PATH}.required`, "'required'"],
    [{ $ref: "#/properties/a" }, `${PATH}.$ref`, "'$ref'"],
    [{ anyOf: [{ type: "string" }], type: "string" }, `${PATH}.type`, "'type'"],
    // llama.cpp's grammars repeat a rule at most 2000 times: a longer bound would fail when the grammar is built.
    [{ type: "object", properties: { text: { type: "string", minLength: 2048 } } }, `${PATH}.properties.text.minLength`, "'minLength'"],
    [{ type: "array", items: { type: "integer" }, maxItems: 5000 }, `${PATH}.maxItems`, "'maxItems'"],
  ];
  for (const [schema, param, keyword] of cases) {
    const error = refusal(schema);
    assert.equal(error.status, 400);
    assert.equal(error.param, param, JSON.stringify(schema));
    assert.ok(error.message.includes(param) && error.message.includes(keyword), error.message);
  }
  // At the limit it still translates.
  assert.deepEqual(toGrammarSchema({ type: "string", minLength: 2000, maxLength: 2000 }, PATH), { type: "string", minLength: 2000, maxLength: 2000 });
});

test("a U+0000 in an enum or const value or a property name is refused naming the keyword (it cuts llama.cpp's grammar text short)", () => {
  const cases: Array<[unknown, string, string]> = [
    [{ type: "object", properties: { e: { enum: ["ok", "a\u0000b"] } } }, `${PATH}.properties.e.enum`, "'enum'"],
    [{ type: "object", properties: { c: { const: "\u0000" } } }, `${PATH}.properties.c.const`, "'const'"],
    [{ type: "object", properties: { "a\u0000": { type: "string" } } }, `${PATH}.properties`, "'properties'"],
  ];
  for (const [schema, param, keyword] of cases) {
    const error = refusal(schema);
    assert.equal(error.param, param);
    assert.ok(error.message.includes(keyword) && error.message.includes("U+0000"), error.message);
  }
  // Other control characters are escaped in the grammar and stay allowed.
  assert.deepEqual(toGrammarSchema({ enum: ["a\u0001b"] }, PATH), { enum: ["a\u0001b"] });
});

test("a $ref must point to a definition in its own schema or one around it", () => {
  const missing = refusal({ type: "object", properties: { a: { $ref: "#/$defs/nope" } } });
  assert.equal(missing.param, `${PATH}.properties.a.$ref`);
  assert.match(missing.message, /'#\/\$defs\/nope' points to no definition/);
  // A definition declared inside a sibling is out of scope, as it is for node-llama-cpp.
  const sibling = refusal({
    type: "object",
    properties: { a: { type: "object", $defs: { x: { type: "string" } }, properties: {} }, b: { $ref: "#/$defs/x" } },
  });
  assert.equal(sibling.param, `${PATH}.properties.b.$ref`);
  // Declared around it, in draft-7 spelling, or referring to itself (recursion): fine.
  assert.ok(
    toGrammarSchema(
      { definitions: { x: { type: "string" } }, type: "object", properties: { a: { type: "object", properties: { b: { $ref: "#/definitions/x" } } } } },
      PATH,
    ),
  );
  assert.ok(
    toGrammarSchema(
      { $defs: { node: { type: "object", properties: { next: { anyOf: [{ $ref: "#/$defs/node" }, { type: "null" }] } } } }, $ref: "#/$defs/node" },
      PATH,
    ),
  );
});

test("tool definitions: duplicates, non-object parameters, unknown named tool_choice and unsupported keywords are 400s naming the field", () => {
  const tool = (name: string, parameters?: Record<string, unknown>) => ({
    type: "function" as const,
    function: { name, ...(parameters ? { parameters } : {}) },
  });
  const param = (body: Parameters<typeof toChatStructure>[0]) => {
    try {
      toChatStructure(body);
    } catch (error) {
      assert.ok(error instanceof BadRequestError);
      return error.param;
    }
    assert.fail("expected a BadRequestError");
  };
  assert.equal(param({ tools: [tool("a"), tool("a")] }), "tools.1.function.name");
  assert.equal(param({ tools: [tool("a", { type: "string" })] }), "tools.0.function.parameters.type");
  assert.equal(param({ tools: [tool("a")], tool_choice: { type: "function", function: { name: "b" } } }), "tool_choice.function.name");
  assert.equal(param({ tool_choice: "required" }), "tool_choice");
  assert.equal(
    param({ tools: [tool("a", { type: "object", properties: { x: { type: "number", maximum: 3 } } })] }),
    "tools.0.function.parameters.properties.x.maximum",
  );
  assert.equal(param({ tools: [tool("a")], response_format: { type: "json_object" } }), "response_format");

  const named = toChatStructure({
    tools: [tool("a"), tool("b", { type: "object", properties: { x: { type: "boolean" } } })],
    tool_choice: { type: "function", function: { name: "b" } },
    parallel_tool_calls: false,
  });
  assert.deepEqual(named.tools?.callable, [{ name: "b", parameters: { type: "object", properties: { x: { type: "boolean" } } } }]);
  assert.deepEqual(
    named.tools?.documented.map((spec) => spec.name),
    ["a", "b"],
    "the prompt still documents every tool",
  );
  assert.equal(named.tools?.forced, true);
  assert.equal(named.tools?.parallel, false);
  assert.deepEqual(toChatStructure({ tools: [tool("a")], tool_choice: "none" }).tools?.callable, [], "tool_choice none: nothing to call");
  assert.equal(toChatStructure({ tools: [tool("a")] }).tools?.forced, false, "auto by default");
});

test("tool grammar checks: a refusal names the tool's index in 'tools'; compiled schemas are remembered, at most 128 of them", async () => {
  // Stands in for node-llama-cpp's Llama: createGrammarForJsonSchema throws for what llama.cpp refuses.
  const compiled: unknown[] = [];
  const llama = {
    createGrammarForJsonSchema: async (schema: { refuse?: boolean }) => {
      compiled.push(schema);
      if ("refuse" in schema) throw new Error("parse: error parsing grammar");
      return {};
    },
  } as unknown as Llama;
  const check = new ToolGrammarCheck(llama);
  const spec = (name: string, parameters?: unknown): ToolSpec => ({ name, ...(parameters ? { parameters: parameters as never } : {}) });
  const bad = spec("b", { refuse: true });
  const documented = [spec("a", { type: "object", properties: {} }), spec("none"), bad];
  await assert.rejects(
    check.check([bad], documented),
    (error: unknown) => error instanceof BadRequestError && error.param === "tools.2.function.parameters" && /'b'/.test(error.message),
  );
  await check.check(documented.slice(0, 2), documented);
  await check.check(documented.slice(0, 2), documented);
  assert.equal(compiled.length, 2, "one refused compile, one compile for 'a' (remembered), none for a tool without parameters");
  for (let i = 0; i < 300; i++) await check.check([spec("t", { type: "object", properties: { [`p${i}`]: { type: "string" } } })], documented);
  assert.equal(check.size, 128);
});

test("grammar numbers lose the exponent and keep at most 15 integer digits; string characters are valid code points", () => {
  const grammar =
    'root ::= integer-number-rule\nstring-char-rule ::= [^"\\\\\\x7F\\x00-\\x1F]\ninteger-number-rule ::= "-"? ("0" | [1-9] [0-9]{0,15}) ([eE] [-+]? ("0" | [1-9] [0-9]{0,15}))?\nfractional-number-rule ::= x';
  const bounded = rewriteGrammarRules(grammar);
  assert.ok(!/\[eE\]/.test(bounded), bounded);
  assert.ok(bounded.includes('integer-number-rule ::= "-"? ("0" | [1-9] [0-9]{0,14})\n'), bounded);
  assert.ok(bounded.includes('fractional-number-rule ::= "-"? ("0" | [1-9] [0-9]{0,14}) ("." [0-9]{1,16})?'), bounded);
  assert.ok(bounded.includes("string-char-rule ::= [\\x20-\\x21\\x23-\\x5B\\x5D-\\x7E\\x80-\\uD7FF\\uE000-\\U0010FFFF]"), bounded);
  assert.equal(rewriteGrammarRules(bounded), bounded);
});

test("streamed tool-call arguments: id and name first, then the JSON value's pieces without the call syntax after it", () => {
  const deltas: ToolCallDelta[] = [];
  const collector = new ToolCallCollector((delta) => deltas.push(delta));
  for (const piece of [" {", '"a": "}', '"', "}", "\n\n\n\n"]) collector.paramsChunk({ callIndex: 0, functionName: "f", paramsChunk: piece });
  collector.functionCall({ functionName: "f", params: { a: "}" } });
  collector.functionCall({ functionName: "g", params: undefined });
  const [first, second] = collector.made();
  assert.equal(first?.arguments, '{"a": "}"}');
  assert.equal(second?.arguments, "{}");
  assert.match(first?.id ?? "", /^call_[0-9a-f]{24}$/);
  assert.deepEqual(deltas[0], { index: 0, id: first?.id, name: "f" });
  assert.equal(deltas.flatMap((d) => ("arguments" in d && d.index === 0 ? [d.arguments] : [])).join(""), first?.arguments);
  assert.deepEqual(deltas.slice(-2), [
    { index: 1, id: second?.id, name: "g" },
    { index: 1, arguments: "{}" },
  ]);
});
