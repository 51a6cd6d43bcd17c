// Structured outputs for the bundled engine: turns the JSON Schemas OpenAI clients send
// (response_format json_schema, tool parameters) into the schema dialect node-llama-cpp
// 3.21.1 compiles into a GBNF grammar (GbnfJsonSchema), refusing every keyword that
// grammar cannot enforce, and holds the grammar for response_format json_object.
//
// Why a translation and not the schema as sent: node-llama-cpp silently ignores what it
// does not know (a `pattern`, a `minimum`, an `anyOf`), and an ignored keyword means an
// answer that does not satisfy the schema. So everything here is either mapped onto a
// construct the grammar enforces, dropped because it only annotates, or refused with a
// 400 that names the keyword and where it is. Facts about GbnfJsonSchema it relies on:
// - `oneOf` generates one of the alternatives, which is JSON Schema's `anyOf`; so
//   `anyOf` maps onto it (an answer satisfying two `oneOf` alternatives is possible).
// - Every property in `properties` is generated (the grammar ignores `required`), and
//   `additionalProperties` defaults to false. An answer with all declared properties and
//   no others satisfies any `required` list that names only declared properties.
// - `$ref` resolves only "#/$defs/<name>"; draft-7's "#/definitions/<name>" is rewritten.
// - A schema with no type generates `null`, so "any value" is spelled out here.
// - Numbers and string characters: see grammar-rewrites.ts.
import type { GbnfJsonSchema } from "node-llama-cpp";
import { BadRequestError } from "../../core/errors.ts";
import { JSON_STRING_CHAR } from "./grammar-rewrites.ts";

type JsonObject = Record<string, unknown>;

// Keywords that describe but do not constrain: accepted and dropped (description is kept,
// it documents tool parameters in the prompt).
const ANNOTATIONS = new Set(["title", "description", "default", "examples", "$comment", "$schema", "$id", "deprecated", "readOnly", "writeOnly"]);
const SCALAR_TYPES = new Set(["string", "number", "integer", "boolean", "null"]);
const FORMATS = new Set(["date-time", "date", "time"]);
// zod's toJSONSchema bounds every .int() by the safe-integer range; the grammar's integers
// have at most 15 digits (grammar-rewrites.ts), which lie inside it, so these bounds hold.
const SAFE_BOUND = Number.MAX_SAFE_INTEGER;

/** A refusal naming the keyword and where it sits in the request. */
function unsupported(path: string, keyword: string, why = "is not supported by the bundled engine's grammar"): BadRequestError {
  return new BadRequestError(`Invalid request body: ${path}: keyword '${keyword}' ${why}; remove it or serve the model with llama-server or vLLM.`, {
    code: "unsupported_schema",
    param: path,
  });
}

/**
 * llama.cpp refuses a grammar that repeats one rule more than 2000 times
 * (MAX_REPETITION_THRESHOLD in llama-grammar.cpp: "number of repetitions exceeds sane
 * defaults"), and the lengths and item counts of a schema become such repetitions, so a
 * larger bound is refused here, naming it. Below it, llama.cpp also multiplies the count by
 * the size of the repeated rule (a string character is several symbols); a grammar it
 * refuses for that is turned into a 400 when it is built (LlamaRunner.grammarFor).
 */
const MAX_REPETITIONS = 2000;

function checkRepetitionBound(value: unknown, path: string, keyword: string): void {
  if (value === undefined) return;
  if (typeof value !== "number" || !Number.isInteger(value) || value < 0) throw invalid(path, "must be a non-negative integer");
  if (value > MAX_REPETITIONS) throw unsupported(path, keyword, `above ${MAX_REPETITIONS} is more than llama.cpp's grammars can repeat (got ${value})`);
}

/**
 * A U+0000 in a string the grammar spells out (an enum or const value, a property name)
 * cuts llama.cpp's GBNF text short at that point, so it would refuse the whole grammar
 * ("unexpected end of input") without saying why; refused here, naming the keyword.
 */
function checkNoNul(value: unknown, path: string, keyword: string): void {
  if (typeof value === "string" && value.includes("\u0000")) {
    throw unsupported(
      path,
      keyword,
      "with a U+0000 character in a string is not supported by the bundled engine's grammar (llama.cpp's grammars cannot hold it)",
    );
  }
}

function invalid(path: string, what: string): BadRequestError {
  return new BadRequestError(`Invalid request body: ${path}: ${what}.`, { code: "invalid_schema", param: path });
}

function isObject(value: unknown): value is JsonObject {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function isPrimitive(value: unknown): value is string | number | boolean | null {
  return value === null || typeof value === "string" || typeof value === "number" || typeof value === "boolean";
}

function matchesType(value: string | number | boolean | null, type: string): boolean {
  if (type === "null") return value === null;
  if (type === "integer") return Number.isInteger(value);
  return typeof value === type;
}

/** Any JSON value: the grammar needs each kind spelled out. */
const ANY_VALUE: GbnfJsonSchema = {
  oneOf: [{ type: ["string", "number", "boolean", "null"] }, { type: "object", additionalProperties: true }, { type: "array" }],
};

class SchemaTranslator {
  /**
   * The definition names each schema being translated declares, outermost first: a $ref
   * resolves against its own schema's definitions and those of the schemas around it
   * (node-llama-cpp joins them the same way), and one that points nowhere would silently
   * become "any value" there, so it is refused.
   */
  private readonly scopes: Array<Set<string>> = [];

  translate(schema: unknown, path: string): GbnfJsonSchema {
    if (schema === true) return ANY_VALUE;
    if (schema === false) throw invalid(path, "the schema 'false' admits no value");
    if (!isObject(schema)) throw invalid(path, "a schema must be a JSON object");
    this.scopes.push(new Set([schema.$defs, schema.definitions].flatMap((defs) => (isObject(defs) ? Object.keys(defs) : []))));
    try {
      return this.translateObject(schema, path);
    } finally {
      this.scopes.pop();
    }
  }

  private translateObject(schema: JsonObject, path: string): GbnfJsonSchema {
    for (const key of Object.keys(schema)) this.checkKeyword(schema, key, path);
    const description = typeof schema.description === "string" ? { description: schema.description } : {};
    const defs = this.defs(schema, path);

    if (typeof schema.$ref === "string") {
      this.onlyWith(schema, path, "$ref", []);
      return { $ref: this.ref(schema.$ref, path), ...defs, ...description } as GbnfJsonSchema;
    }
    for (const combinator of ["anyOf", "oneOf"] as const) {
      const alternatives = schema[combinator];
      if (alternatives === undefined) continue;
      if (!Array.isArray(alternatives) || alternatives.length === 0) throw invalid(`${path}.${combinator}`, "must be a non-empty array of schemas");
      this.onlyWith(schema, path, combinator, []);
      return { oneOf: alternatives.map((alt, i) => this.translate(alt, `${path}.${combinator}[${i}]`)), ...defs, ...description } as GbnfJsonSchema;
    }
    const types = this.types(schema, path);
    if (schema.const !== undefined) {
      if (!isPrimitive(schema.const))
        throw unsupported(`${path}.const`, "const", "with an object or array value is not supported by the bundled engine's grammar");
      if (types && !types.some((t) => matchesType(schema.const as never, t))) throw invalid(`${path}.const`, "the value does not have the schema's type");
      checkNoNul(schema.const, `${path}.const`, "const");
      return { const: schema.const, ...description };
    }
    if (schema.enum !== undefined) {
      if (!Array.isArray(schema.enum) || schema.enum.length === 0) throw invalid(`${path}.enum`, "must be a non-empty array");
      if (!schema.enum.every(isPrimitive))
        throw unsupported(`${path}.enum`, "enum", "with object or array values is not supported by the bundled engine's grammar");
      for (const value of schema.enum) checkNoNul(value, `${path}.enum`, "enum");
      const values = types ? schema.enum.filter((v) => types.some((t) => matchesType(v, t))) : schema.enum;
      if (values.length === 0) throw invalid(`${path}.enum`, "no value has the schema's type");
      return { enum: values, ...description };
    }
    if (!types) {
      // No type: JSON Schema admits any value; properties or items alone say what an
      // object or array must look like, so generate that kind.
      if (schema.properties !== undefined || schema.additionalProperties !== undefined) return this.typed(schema, "object", path, description, defs);
      if (schema.items !== undefined || schema.prefixItems !== undefined) return this.typed(schema, "array", path, description, defs);
      return { ...ANY_VALUE, ...defs, ...description } as GbnfJsonSchema;
    }
    if (types.length === 1) return this.typed(schema, types[0] as string, path, description, defs);
    // Several types: scalars without constraints stay one type list; otherwise each type
    // becomes its own alternative with the keywords that apply to it.
    if (types.every((t) => SCALAR_TYPES.has(t) && t !== "string") || (types.every((t) => SCALAR_TYPES.has(t)) && !this.hasStringConstraints(schema))) {
      return { type: types as never, ...description };
    }
    return { oneOf: types.map((t) => this.typed(schema, t, path, {}, {})), ...defs, ...description } as GbnfJsonSchema;
  }

  private hasStringConstraints(schema: JsonObject): boolean {
    return schema.minLength !== undefined || schema.maxLength !== undefined || schema.format !== undefined;
  }

  private typed(schema: JsonObject, type: string, path: string, description: object, defs: object): GbnfJsonSchema {
    if (type === "object") return { ...this.object(schema, path), ...defs, ...description } as GbnfJsonSchema;
    if (type === "array") return { ...this.array(schema, path), ...defs, ...description } as GbnfJsonSchema;
    if (type === "string") return { ...this.string(schema, path), ...description };
    if (type === "number" || type === "integer") this.numberBounds(schema, path);
    return { type: type as "number", ...description };
  }

  private object(schema: JsonObject, path: string): GbnfJsonSchema {
    const properties: Record<string, GbnfJsonSchema> = {};
    if (schema.properties !== undefined) {
      if (!isObject(schema.properties)) throw invalid(`${path}.properties`, "must be an object of schemas");
      for (const [name, sub] of Object.entries(schema.properties)) {
        checkNoNul(name, `${path}.properties`, "properties");
        properties[name] = this.translate(sub, `${path}.properties.${name}`);
      }
    }
    if (schema.required !== undefined) {
      if (!Array.isArray(schema.required)) throw invalid(`${path}.required`, "must be an array of property names");
      const missing = schema.required.find((name) => typeof name !== "string" || !(name in properties));
      if (missing !== undefined)
        throw unsupported(
          `${path}.required`,
          "required",
          `names '${String(missing)}', which is not in 'properties'; the bundled engine's grammar generates exactly the declared properties, so declare it`,
        );
    }
    const extra = schema.additionalProperties;
    const additional = extra === undefined || extra === false ? undefined : extra === true ? ANY_VALUE : this.translate(extra, `${path}.additionalProperties`);
    for (const bound of ["minProperties", "maxProperties"] as const) {
      const value = schema[bound];
      if (value === undefined) continue;
      if (typeof value !== "number" || !Number.isInteger(value) || value < 0) throw invalid(`${path}.${bound}`, "must be a non-negative integer");
    }
    const count = Object.keys(properties).length;
    if (typeof schema.minProperties === "number" && schema.minProperties > count && additional === undefined) {
      throw unsupported(
        `${path}.minProperties`,
        "minProperties",
        "above the number of declared properties, without additionalProperties, is not supported by the bundled engine's grammar",
      );
    }
    if (typeof schema.maxProperties === "number" && schema.maxProperties < count) {
      throw unsupported(
        `${path}.maxProperties`,
        "maxProperties",
        "below the number of declared properties is not supported by the bundled engine's grammar (it generates every declared property)",
      );
    }
    return {
      type: "object",
      properties,
      ...(additional === undefined ? {} : { additionalProperties: additional }),
      ...(typeof schema.minProperties === "number" ? { minProperties: schema.minProperties } : {}),
      ...(typeof schema.maxProperties === "number" ? { maxProperties: schema.maxProperties } : {}),
    } as GbnfJsonSchema;
  }

  private array(schema: JsonObject, path: string): GbnfJsonSchema {
    if (Array.isArray(schema.items))
      throw unsupported(`${path}.items`, "items", "as an array (draft-4 tuples) is not supported by the bundled engine's grammar; use prefixItems");
    if (schema.items === false) throw unsupported(`${path}.items`, "items", "set to false is not supported by the bundled engine's grammar");
    const items = schema.items === undefined || schema.items === true ? undefined : this.translate(schema.items, `${path}.items`);
    let prefixItems: GbnfJsonSchema[] | undefined;
    if (schema.prefixItems !== undefined) {
      if (!Array.isArray(schema.prefixItems)) throw invalid(`${path}.prefixItems`, "must be an array of schemas");
      prefixItems = schema.prefixItems.map((item, i) => this.translate(item, `${path}.prefixItems[${i}]`));
    }
    for (const bound of ["minItems", "maxItems"] as const) checkRepetitionBound(schema[bound], `${path}.${bound}`, bound);
    if (prefixItems && typeof schema.maxItems === "number" && schema.maxItems < prefixItems.length) {
      throw unsupported(`${path}.maxItems`, "maxItems", "below the number of prefixItems is not supported by the bundled engine's grammar");
    }
    return {
      type: "array",
      ...(items === undefined ? {} : { items }),
      ...(prefixItems === undefined ? {} : { prefixItems }),
      ...(typeof schema.minItems === "number" ? { minItems: schema.minItems } : {}),
      ...(typeof schema.maxItems === "number" ? { maxItems: schema.maxItems } : {}),
    } as GbnfJsonSchema;
  }

  private string(schema: JsonObject, path: string): GbnfJsonSchema {
    for (const bound of ["minLength", "maxLength"] as const) checkRepetitionBound(schema[bound], `${path}.${bound}`, bound);
    if (schema.format !== undefined) {
      if (typeof schema.format !== "string" || !FORMATS.has(schema.format)) {
        throw unsupported(
          `${path}.format`,
          "format",
          `'${String(schema.format)}' is not supported by the bundled engine's grammar (it knows date-time, date and time)`,
        );
      }
      if (schema.minLength !== undefined || schema.maxLength !== undefined)
        throw unsupported(`${path}.format`, "format", "together with minLength or maxLength is not supported by the bundled engine's grammar");
      return { type: "string", format: schema.format as "date" };
    }
    if (typeof schema.minLength === "number" && typeof schema.maxLength === "number" && schema.maxLength < schema.minLength) {
      throw invalid(`${path}.maxLength`, "is below minLength");
    }
    return {
      type: "string",
      ...(typeof schema.minLength === "number" ? { minLength: schema.minLength } : {}),
      ...(typeof schema.maxLength === "number" ? { maxLength: schema.maxLength } : {}),
    };
  }

  /** Numeric bounds the grammar cannot enforce are refused, except zod's safe-integer ones. */
  private numberBounds(schema: JsonObject, path: string): void {
    if (schema.minimum !== undefined && !(typeof schema.minimum === "number" && schema.minimum <= -SAFE_BOUND)) throw unsupported(`${path}.minimum`, "minimum");
    if (schema.maximum !== undefined && !(typeof schema.maximum === "number" && schema.maximum >= SAFE_BOUND)) throw unsupported(`${path}.maximum`, "maximum");
  }

  private types(schema: JsonObject, path: string): string[] | undefined {
    if (schema.type === undefined) return undefined;
    const types = Array.isArray(schema.type) ? schema.type : [schema.type];
    const known = new Set([...SCALAR_TYPES, "object", "array"]);
    const bad = types.find((t) => typeof t !== "string" || !known.has(t));
    if (types.length === 0 || bad !== undefined) throw invalid(`${path}.type`, `'${String(bad)}' is not a JSON Schema type`);
    return types as string[];
  }

  /** $defs and draft-7 definitions, translated, as node-llama-cpp's $defs. */
  private defs(schema: JsonObject, path: string): { $defs?: Record<string, GbnfJsonSchema> } {
    const out: Record<string, GbnfJsonSchema> = {};
    for (const key of ["$defs", "definitions"] as const) {
      const defs = schema[key];
      if (defs === undefined) continue;
      if (!isObject(defs)) throw invalid(`${path}.${key}`, "must be an object of schemas");
      for (const [name, sub] of Object.entries(defs)) out[name] = this.translate(sub, `${path}.${key}.${name}`);
    }
    return Object.keys(out).length === 0 ? {} : { $defs: out };
  }

  private ref(ref: string, path: string): string {
    const match = /^#\/(?:\$defs|definitions)\/([^/]+)$/.exec(ref);
    if (!match)
      throw unsupported(`${path}.$ref`, "$ref", `'${ref}' is not supported by the bundled engine's grammar (only '#/$defs/<name>' and '#/definitions/<name>')`);
    const name = match[1] as string;
    if (!this.scopes.some((scope) => scope.has(name)))
      throw invalid(`${path}.$ref`, `'${ref}' points to no definition; add '${name}' to $defs or fix the reference`);
    return `#/$defs/${name}`;
  }

  /** Refuses validation keywords next to a keyword that the grammar applies alone. */
  private onlyWith(schema: JsonObject, path: string, keyword: string, allowed: string[]): void {
    for (const key of Object.keys(schema)) {
      if (key === keyword || ANNOTATIONS.has(key) || key === "$defs" || key === "definitions" || allowed.includes(key)) continue;
      throw unsupported(`${path}.${key}`, key, `next to '${keyword}' is not supported by the bundled engine's grammar`);
    }
  }

  private checkKeyword(schema: JsonObject, key: string, path: string): void {
    if (ANNOTATIONS.has(key) || SUPPORTED.has(key)) return;
    // Neutral values of keywords that would otherwise be refused.
    if (key === "uniqueItems" && schema.uniqueItems === false) return;
    if (key === "additionalItems" && (schema.additionalItems === true || schema.additionalItems === undefined)) return;
    throw unsupported(`${path}.${key}`, key);
  }
}

const SUPPORTED = new Set([
  "type",
  "properties",
  "required",
  "additionalProperties",
  "minProperties",
  "maxProperties",
  "items",
  "prefixItems",
  "minItems",
  "maxItems",
  "minLength",
  "maxLength",
  "format",
  "enum",
  "const",
  "anyOf",
  "oneOf",
  "$ref",
  "$defs",
  "definitions",
  "minimum",
  "maximum",
]);

/**
 * The grammar schema for a JSON Schema sent at `path` (for example
 * "response_format.json_schema.schema"); throws a 400 naming the first keyword the
 * grammar cannot enforce.
 */
export function toGrammarSchema(schema: unknown, path: string): GbnfJsonSchema {
  return new SchemaTranslator().translate(schema, path);
}

/**
 * response_format json_object: any JSON object, with bounds so that the answer ends even
 * when the weights never choose to close a string (a random model's almost never do):
 * keys of at most 64 characters, string values of at most 256, at most 16 members, and
 * values nested at most three levels deep. `\n\n\n\n` ends the grammar, as in
 * node-llama-cpp's own JSON grammars, which stop on it; so whitespace inside holds at
 * most one line break.
 */
export const JSON_OBJECT_GRAMMAR = [
  'root ::= object1 "\\n\\n\\n\\n" [\\n]*',
  "ws ::= [ \\t]{0,8} | [\\n] [ \\t]{0,8}",
  `char ::= ${JSON_STRING_CHAR}`,
  'key ::= "\\"" char{0,64} "\\""',
  'string ::= "\\"" char{0,256} "\\""',
  'number ::= "-"? ("0" | [1-9] [0-9]{0,14}) ("." [0-9]{1,16})?',
  'scalar ::= string | number | "true" | "false" | "null"',
  'object1 ::= "{" ws ( key ws ":" ws value2 ( ws "," ws key ws ":" ws value2 ){0,15} )? ws "}"',
  "value2 ::= scalar | object2 | array2",
  'object2 ::= "{" ws ( key ws ":" ws value3 ( ws "," ws key ws ":" ws value3 ){0,15} )? ws "}"',
  'array2 ::= "[" ws ( value3 ( ws "," ws value3 ){0,15} )? ws "]"',
  "value3 ::= scalar | object3 | array3",
  'object3 ::= "{" ws ( key ws ":" ws scalar ( ws "," ws key ws ":" ws scalar ){0,15} )? ws "}"',
  'array3 ::= "[" ws ( scalar ( ws "," ws scalar ){0,15} )? ws "]"',
].join("\n");
