// parseJsonBody: the one parse of every JSON request body. Empty, malformed and over-deep
// bodies get their 400s; a key the top-level object repeats gets 400 duplicate_key, since
// the gateway forwards bodies as they came and an engine's parser may keep the first of
// two keys where JSON.parse keeps the last.
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
  // Nested duplicates keep JSON.parse's rule (the last wins); only the top level is checked.
  assert.deepEqual(parseJsonBody('{"model":"m","metadata":{"k":1,"k":2}}'), { model: "m", metadata: { k: 2 } });
});

test("arrays and scalars at the top level have no keys to repeat", () => {
  assert.deepEqual(parseJsonBody('["model","model",{"model":1},{"model":2}]'), ["model", "model", { model: 1 }, { model: 2 }]);
  assert.deepEqual(parseJsonBody('[{"a":1,"a":2}]'), [{ a: 2 }]);
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
});

test("a very long repeated key is named cut short", () => {
  const key = "k".repeat(500);
  assert.throws(
    () => parseJsonBody(`{"${key}":1,"${key}":2}`),
    (error: unknown) => refusedAs("duplicate_key")(error) && (error as BadRequestError).message.length < 200,
  );
});
