import { test } from "node:test";
import assert from "node:assert/strict";
import { z } from "zod";
import { BadRequestError, UnavailableError, describeError, parseWith, renderError } from "./errors.ts";

test("renderError gives the OpenAI error shape with status and headers", () => {
  const rendered = renderError(new UnavailableError("No ready replica for 'demo'.", { retryAfterSeconds: 5 }));
  assert.equal(rendered.status, 503);
  assert.equal(rendered.headers["retry-after"], "5");
  assert.deepEqual(rendered.body, {
    error: { message: "No ready replica for 'demo'.", type: "service_unavailable_error", param: null, code: "unavailable" },
  });
});

test("renderError hides the text of unexpected errors", () => {
  const rendered = renderError(new Error("ENOENT /secret/path"));
  assert.equal(rendered.status, 500);
  assert.doesNotMatch(rendered.body.error.message, /secret/);
});

test("parseWith names the offending field", () => {
  const schema = z.object({ scaling: z.object({ min: z.number().int().min(0) }) });
  assert.throws(
    () => parseWith(schema, { scaling: { min: -1 } }),
    (error: unknown) => error instanceof BadRequestError && error.param === "scaling.min" && /scaling\.min/.test(error.message),
  );
});

test("describeError drops a final full stop so messages that go on after it do not end twice", () => {
  assert.equal(describeError(new Error("disk full.")), "disk full");
  assert.equal(describeError(new Error("wait...")), "wait...");
  assert.equal(`failed: ${describeError(new Error("No space left on device."))}. Free some space.`, "failed: No space left on device. Free some space.");
});
