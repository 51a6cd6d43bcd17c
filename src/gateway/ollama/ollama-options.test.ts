// Ollama's options: the samplers the engines take are mapped onto the chat body; the ones
// not every engine has pass only when off; load-time settings are accepted and ignored;
// an unknown name or a wrong type is a 400 naming options.<name>.
import { test } from "node:test";
import assert from "node:assert/strict";
import { parseWith, type BadRequestError } from "../../core/errors.ts";
import type { GatewayRequestBody } from "../request-schemas.ts";
import { applyOptions, ollamaOptionsSchema } from "./ollama-options.ts";
import { z } from "zod";

const schema = z.strictObject({ options: ollamaOptionsSchema.optional() });

function mapped(options: unknown): GatewayRequestBody {
  const body: GatewayRequestBody = { model: "m" };
  applyOptions(body, parseWith(schema, { options }, "request").options);
  return body;
}

function refusal(options: unknown): BadRequestError {
  try {
    parseWith(schema, { options }, "request");
  } catch (error) {
    return error as BadRequestError;
  }
  assert.fail(`options ${JSON.stringify(options)} were accepted`);
}

test("the samplers the engines take go on the chat body under their OpenAI and llama.cpp names", () => {
  const body = mapped({
    temperature: 0.3,
    top_p: 0.9,
    top_k: 20,
    min_p: 0.05,
    seed: 42,
    num_predict: 100,
    stop: ["</s>", "END"],
    repeat_penalty: 1.1,
    presence_penalty: 0.5,
    frequency_penalty: -0.5,
  });
  assert.deepEqual(body, {
    model: "m",
    temperature: 0.3,
    top_p: 0.9,
    top_k: 20,
    min_p: 0.05,
    seed: 42,
    max_tokens: 100,
    stop: ["</s>", "END"],
    repeat_penalty: 1.1,
    presence_penalty: 0.5,
    frequency_penalty: -0.5,
  });
});

test("num_predict -1 and -2 mean no limit: max_tokens stays out; 0 is refused", () => {
  assert.equal(mapped({ num_predict: -1 }).max_tokens, undefined);
  assert.equal(mapped({ num_predict: -2 }).max_tokens, undefined);
  const error = refusal({ num_predict: 0 });
  assert.equal(error.status, 400);
  assert.equal(error.param, "options.num_predict");
});

test("load-time settings and the options Ollama itself ignores are accepted and change nothing", () => {
  const body = mapped({
    num_ctx: 8192,
    num_batch: 512,
    num_gpu: 99,
    main_gpu: 0,
    low_vram: false,
    f16_kv: true,
    logits_all: false,
    vocab_only: false,
    use_mmap: true,
    use_mlock: false,
    embedding_only: false,
    num_thread: 8,
    numa: false,
    num_keep: 4,
    penalize_newline: true,
  });
  assert.deepEqual(body, { model: "m" });
});

test("samplers not every engine has pass only at the values that switch them off", () => {
  assert.deepEqual(mapped({ typical_p: 1, tfs_z: 1, mirostat: 0, mirostat_tau: 5, mirostat_eta: 0.1, repeat_last_n: 64, repeat_penalty: 1.2 }), {
    model: "m",
    repeat_penalty: 1.2,
  });
  // The window matters only when a penalty applies.
  assert.deepEqual(mapped({ repeat_last_n: 128 }), { model: "m" });
  for (const [name, value] of [
    ["typical_p", 0.7],
    ["tfs_z", 0.95],
    ["mirostat", 2],
  ] as const) {
    const error = refusal({ [name]: value });
    assert.equal(error.param, `options.${name}`);
    assert.match(error.message, /leave it out/);
  }
  assert.equal(refusal({ repeat_last_n: 128, repeat_penalty: 1.3 }).param, "options.repeat_last_n");
});

test("an unknown option is refused with its name", () => {
  const error = refusal({ temperature: 0.2, temprature: 0.2 });
  assert.equal(error.status, 400);
  assert.equal(error.param, "options.temprature");
  assert.match(error.message, /options\.temprature/);
  assert.match(error.message, /temperature, top_p/, "the options it takes are named");
});

test("an option of the wrong type is refused with its name and the type expected", () => {
  const cases: Array<[Record<string, unknown>, string, RegExp]> = [
    [{ temperature: "hot" }, "options.temperature", /must be a number/],
    [{ num_ctx: 2048.5 }, "options.num_ctx", /must be an integer/],
    [{ use_mmap: "yes" }, "options.use_mmap", /must be a boolean/],
    [{ stop: "END" }, "options.stop", /must be an array of strings/],
    [{ temperature: 3 }, "options.temperature", /from 0 to 2/],
  ];
  for (const [options, param, message] of cases) {
    const error = refusal(options);
    assert.equal(error.param, param, JSON.stringify(options));
    assert.match(error.message, message);
  }
  assert.equal(refusal("hot").param, "options");
});
