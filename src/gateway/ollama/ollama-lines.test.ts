// The shared pieces of Ollama's answers: the done reason, tool calls with object
// arguments (and those that are none kept as text), and the durations' split.
import { test } from "node:test";
import assert from "node:assert/strict";
import { GenerationTiming, doneReason, toOllamaCalls } from "./ollama-lines.ts";

test("the done reason is 'length' at the token limit, else 'stop' (a tool call's end included)", () => {
  assert.equal(doneReason("length"), "length");
  for (const finish of ["stop", "tool_calls", "content_filter", null, undefined]) assert.equal(doneReason(finish), "stop");
});

test("call arguments become objects; an empty text is no arguments; anything else is kept as text", () => {
  assert.deepEqual(
    toOllamaCalls([
      { name: "a", arguments: '{"x":[1,2]}' },
      { name: "b", arguments: " " },
      { name: "c", arguments: "[1]" },
      { name: "d", arguments: "{oops" },
    ]),
    {
      calls: [{ function: { name: "a", arguments: { x: [1, 2] } } }, { function: { name: "b", arguments: {} } }],
      text: '{"name":"c","arguments":"[1]"}{"name":"d","arguments":"{oops"}',
    },
  );
});

test("the prompt's share runs to the first output, the generation's from there; no output: all of it is the prompt's", () => {
  const clock = { now: 100 };
  const timing = new GenerationTiming({ startedAt: 100, clock: () => clock.now });
  clock.now = 250;
  timing.output();
  clock.now = 300;
  timing.output();
  clock.now = 1_000;
  assert.deepEqual(timing.durations(), { total_duration: 900, prompt_eval_duration: 150, eval_duration: 750 });
  const silent = new GenerationTiming({ startedAt: 0, clock: () => 40 });
  assert.deepEqual(silent.durations(), { total_duration: 40, prompt_eval_duration: 40, eval_duration: 0 });
});
