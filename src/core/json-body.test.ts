// parseJsonBody: the one parse of every JSON request body. Empty, malformed and over-deep
// bodies get their 400s; a key that any object of the body repeats gets 400 duplicate_key
// naming the key and where it is, since the gateway forwards bodies as they came and an
// engine's parser may keep the first of two keys where JSON.parse keeps the last.
import { test } from "node:test";
import assert from "node:assert/strict";
import { BadRequestError } from "./errors.ts";
import { MAX_JSON_DEPTH, parseJsonBody } from "./json-body.ts";

function refusedAs(code: string, message?: RegExp) {
  return (error: unknown) => error instanceof BadRequestError && error.code === code && (message === undefined || message.test(error.message));
}

test("a key given twice at the top level is refused, naming the key", () => {
  assert.throws(
    () => parseJsonBody('{"model":"a","model":"b"}'),
    (error: unknown) =>
      refusedAs("duplicate_key")(error) &&
      (error as BadRequestError).message === "The request body has the key 'model' twice; send each key once." &&
      (error as BadRequestError).param === "model" &&
      (error as BadRequestError).status === 400,
  );
  // Far apart, with blanks and values of every kind between them.
  const spread = '{ "model" : "a", "messages": [{"role":"user","content":"hi"}], "n": 1, "stop": null, "x": true,\n\t"model":"b" }';
  assert.throws(() => parseJsonBody(spread), refusedAs("duplicate_key", /'model'/));
  // The first repeated key is the one named.
  assert.throws(() => parseJsonBody('{"a":1,"b":2,"b":3,"a":4}'), refusedAs("duplicate_key", /'b'/));
});

test("keys are compared as JSON decodes them: escapes spell the same key", () => {
  assert.throws(() => parseJsonBody('{"model":"a","mo\\u0064el":"b"}'), refusedAs("duplicate_key", /'model'/));
  assert.throws(() => parseJsonBody('{"\\u006dodel":"a","model":"b"}'), refusedAs("duplicate_key", /'model'/));
  assert.throws(() => parseJsonBody('{"a\\"b":1,"a\\u0022b":2}'), refusedAs("duplicate_key", /'a"b'/));
  assert.throws(() => parseJsonBody('{"\\\\":1,"\\u005c":2}'), refusedAs("duplicate_key"));
  // Different keys stay different, even when their escaped spellings look alike.
  assert.deepEqual(parseJsonBody('{"a\\\\":1,"a\\"":2,"a":3}'), { "a\\": 1, 'a"': 2, a: 3 });
});

test("text inside strings is not a key: quotes, braces, commas and colons in values and keys", () => {
  const body = '{"content":"{\\"model\\":\\"x\\"}, \\"model\\": ","model":"m","note":"\\\\","other":"a,\\"model\\":b"}';
  assert.deepEqual(parseJsonBody(body), { content: '{"model":"x"}, "model": ', model: "m", note: "\\", other: 'a,"model":b' });
  assert.deepEqual(parseJsonBody('{"a,\\"b\\":1":1,"b":2}'), { 'a,"b":1': 1, b: 2 });
});

test("the same keys in nested objects, or in objects inside arrays, are not top-level duplicates", () => {
  const body = {
    model: "m",
    messages: [
      { role: "system", content: "a" },
      { role: "user", content: "b" },
    ],
    stream_options: { include_usage: true },
    metadata: { model: "other", nested: { model: "third" } },
  };
  assert.deepEqual(parseJsonBody(JSON.stringify(body)), body);
  // A key of an object closed before a sibling key of the same name is not that key's twin.
  assert.deepEqual(parseJsonBody('{"a":{"a":{"a":1}},"b":{"a":2}}'), { a: { a: { a: 1 } }, b: { a: 2 } });
});

test("a key repeated inside a message is refused, naming the key and the message", () => {
  // The gateway's guard would read "ok" (the last); an engine keeping the first would run "evil".
  assert.throws(
    () => parseJsonBody('{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"evil","content":"ok"}]}'),
    (error: unknown) =>
      refusedAs("duplicate_key")(error) &&
      (error as BadRequestError).message === "The request body has the key 'content' twice in messages[1]; send each key once." &&
      (error as BadRequestError).param === "messages[1].content" &&
      (error as BadRequestError).status === 400,
  );
  // Apart, with nested values between the two.
  assert.throws(
    () => parseJsonBody('{"model":"m","metadata":{"k":1,"deep":{"k":[1,{"k":2}]},"list":[],"k":3}}'),
    (error: unknown) => refusedAs("duplicate_key")(error) && (error as BadRequestError).param === "metadata.k",
  );
});

test("a key repeated deep in a tool's JSON schema is refused, with its whole place", () => {
  const tool = (name: string, properties: string) =>
    `{"type":"function","function":{"name":"${name}","parameters":{"type":"object","properties":${properties}}}}`;
  const legit = `{"model":"m","messages":[],"tools":[${tool("a", '{"city":{"type":"string"}}')},${tool("b", '{"city":{"type":"string"},"type":{"type":"string"}}')}]}`;
  assert.equal((parseJsonBody(legit) as { tools: unknown[] }).tools.length, 2);
  const twice = `{"model":"m","messages":[],"tools":[${tool("a", '{"city":{"type":"string"}}')},${tool("b", '{"city":{"type":"string"},"city":{"type":"number"}}')}]}`;
  assert.throws(
    () => parseJsonBody(twice),
    (error: unknown) =>
      refusedAs("duplicate_key", /'city' twice in tools\[1\]\.function\.parameters\.properties;/)(error) &&
      (error as BadRequestError).param === "tools[1].function.parameters.properties.city",
  );
});

test("objects in an array may each have the same keys; a repeat within one of them is refused", () => {
  const messages = Array.from({ length: 50 }, (_, n) => ({ role: n % 2 === 0 ? "user" : "assistant", content: `m${n}`, name: "x" }));
  assert.deepEqual(parseJsonBody(JSON.stringify({ model: "m", messages })), { model: "m", messages });
  const body = JSON.stringify({ model: "m", messages }).replace('"content":"m37"', '"content":"m37","content":"again"');
  assert.throws(
    () => parseJsonBody(body),
    (error: unknown) => refusedAs("duplicate_key")(error) && (error as BadRequestError).param === "messages[37].content",
  );
});

test("nested keys are compared decoded, and text inside strings is not a key", () => {
  assert.throws(
    () => parseJsonBody('{"messages":[{"role":"user","cont\\u0065nt":"a","content":"b"}]}'),
    (error: unknown) => refusedAs("duplicate_key", /'content'/)(error) && (error as BadRequestError).param === "messages[0].content",
  );
  assert.throws(() => parseJsonBody('{"o":{"a\\"b":1,"a\\u0022b":2}}'), refusedAs("duplicate_key", /'a"b' twice in o;/));
  // Escaped spellings of different keys stay different.
  assert.deepEqual(parseJsonBody('{"o":{"a\\\\":1,"a\\"":2,"a":3}}'), { o: { "a\\": 1, 'a"': 2, a: 3 } });
  // Keys written inside string values, with escaped quotes and backslashes before the real end.
  const inValues = '{"messages":[{"role":"user","content":"{\\"role\\":1} \\\\","x":"\\"content\\":2, {\\"role\\""}]}';
  assert.deepEqual(parseJsonBody(inValues), JSON.parse(inValues));
  // A place named by a key with escapes shows it decoded.
  assert.throws(
    () => parseJsonBody('{"m\\u0065ta":{"k":1,"k":2}}'),
    (error: unknown) => (error as BadRequestError).param === "meta.k",
  );
});

test("an object with many keys is checked as well as a small one", () => {
  const keys = Array.from({ length: 40 }, (_, n) => `key${n}`);
  const object = Object.fromEntries(keys.map((key, n) => [key, n]));
  assert.deepEqual(parseJsonBody(JSON.stringify({ o: object, p: object })), { o: object, p: object });
  const withExtra = (extra: string) => `{"o":${JSON.stringify(object).slice(0, -1)},${extra}}}`;
  // A repeat of one of the first keys (compared one by one) and of a later one (held in a Set).
  assert.throws(
    () => parseJsonBody(withExtra('"key3":0')),
    (error: unknown) => (error as BadRequestError).param === "o.key3",
  );
  assert.throws(
    () => parseJsonBody(withExtra('"key30":0')),
    (error: unknown) => (error as BadRequestError).param === "o.key30",
  );
  assert.throws(
    () => parseJsonBody(withExtra('"key\\u0033":0')),
    (error: unknown) => (error as BadRequestError).param === "o.key3",
  );
  // The next big object at that depth, and the next body, start with no keys.
  assert.deepEqual(parseJsonBody(JSON.stringify([object, object])), [object, object]);
  assert.deepEqual(parseJsonBody(JSON.stringify({ o: object })), { o: object });
});

test("arrays and scalars at the top level have no keys of their own to repeat", () => {
  assert.deepEqual(parseJsonBody('["model","model",{"model":1},{"model":2}]'), ["model", "model", { model: 1 }, { model: 2 }]);
  assert.deepEqual(parseJsonBody('[{"a":1},{"a":2}]'), [{ a: 1 }, { a: 2 }]);
  // Objects inside a top-level array are checked like any others.
  assert.throws(
    () => parseJsonBody('[{"a":1,"a":2}]'),
    (error: unknown) => refusedAs("duplicate_key", /'a' twice in \[0\];/)(error) && (error as BadRequestError).param === "[0].a",
  );
  assert.equal(parseJsonBody('"model"'), "model");
  assert.equal(parseJsonBody("42"), 42);
  assert.deepEqual(parseJsonBody("{}"), {});
});

test("malformed JSON is reported as malformed, even when it repeats a key", () => {
  assert.throws(() => parseJsonBody('{"model":"a","model":'), refusedAs("invalid_json", /not valid JSON/));
  assert.throws(() => parseJsonBody('{"mo\\x":1,"mo\\x":2}'), refusedAs("invalid_json"));
  assert.throws(() => parseJsonBody("  \n"), refusedAs("invalid_json", /empty/));
});

test("nesting deeper than the limit is refused before parsing; at the limit it parses", () => {
  const atLimit = `${"[".repeat(MAX_JSON_DEPTH)}${"]".repeat(MAX_JSON_DEPTH)}`;
  assert.equal(Array.isArray(parseJsonBody(atLimit)), true);
  const over = `{"a":${"[".repeat(MAX_JSON_DEPTH)}${"]".repeat(MAX_JSON_DEPTH)}}`;
  assert.throws(() => parseJsonBody(over), refusedAs("json_too_deep"));
  // Brackets inside strings do not count.
  assert.deepEqual(parseJsonBody(`{"a":"${"[".repeat(MAX_JSON_DEPTH + 5)}"}`), { a: "[".repeat(MAX_JSON_DEPTH + 5) });
  // Too deep wins over a repeated key before it; objects at every depth up to the limit are checked.
  assert.throws(() => parseJsonBody(`{"a":1,"a":2,"b":${"[".repeat(MAX_JSON_DEPTH)}${"]".repeat(MAX_JSON_DEPTH)}}`), refusedAs("json_too_deep"));
  const deepObjects = (innermost: string) => `${'{"k":'.repeat(MAX_JSON_DEPTH - 1)}${innermost}${"}".repeat(MAX_JSON_DEPTH - 1)}`;
  assert.equal(typeof parseJsonBody(deepObjects('{"k":1,"j":2}')), "object");
  assert.throws(
    () => parseJsonBody(deepObjects('{"k":1,"k":2}')),
    (error: unknown) => {
      const { message, param } = error as BadRequestError;
      // The place is cut to its end: the message stays short.
      return refusedAs("duplicate_key")(error) && message.length < 300 && param?.endsWith("k.k.k") === true && param.startsWith("…");
    },
  );
  // A body refused as too deep leaves nothing behind for the next one.
  assert.deepEqual(parseJsonBody('{"a":{"k":1},"b":{"k":1}}'), { a: { k: 1 }, b: { k: 1 } });
});

test("a very long repeated key is named cut short", () => {
  const key = "k".repeat(500);
  assert.throws(
    () => parseJsonBody(`{"${key}":1,"${key}":2}`),
    (error: unknown) => refusedAs("duplicate_key")(error) && (error as BadRequestError).message.length < 200,
  );
});
