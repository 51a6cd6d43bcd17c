// The lockstep's rules, on stand-in sequences whose token steps the test finishes by hand
// (llama-runner.test.ts shows the effect on the real llama.cpp: shared decode batches).
import { test } from "node:test";
import assert from "node:assert/strict";
import type { LlamaContextSequence, Token } from "node-llama-cpp";
import { eventually } from "../../../test/support/eventually.ts";
import { DecodeLockstep } from "./decode-lockstep.ts";

/** A stand-in sequence: each step of its token iterator waits until the test finishes it. */
class StandInSequence {
  /** Steps asked for and not finished yet, oldest first. */
  readonly pending: Array<() => void> = [];
  /** Where the next evaluated token goes (the tokens the sequence holds). */
  nextTokenIndex = 0;

  constructor(
    readonly name: string,
    private readonly log: string[],
  ) {}

  evaluate(): AsyncGenerator<Token, void, unknown> {
    const self = this;
    return (async function* () {
      for (let step = 0; ; step += 1) {
        self.log.push(`${self.name} asks`);
        await new Promise<void>((resolve) => self.pending.push(resolve));
        yield step as Token;
      }
    })();
  }

  /** Evaluates without sampling, as node-llama-cpp rebuilds a sequence it could not trim. */
  async evaluateWithoutGeneratingNewTokens(tokens: Token[]): Promise<void> {
    this.nextTokenIndex += tokens.length;
  }

  /** Finishes the oldest pending step. */
  finish(): void {
    const next = this.pending.shift();
    assert.ok(next, `${this.name} has a pending step`);
    next();
  }

  asLlama(): LlamaContextSequence {
    return this as unknown as LlamaContextSequence;
  }
}

function setUp(count: number) {
  const log: string[] = [];
  const lockstep = new DecodeLockstep();
  const sequences = Array.from({ length: count }, (_, index) => new StandInSequence(`s${index}`, log));
  for (const sequence of sequences) lockstep.attach(sequence.asLlama());
  return { log, lockstep, sequences };
}

/** Pulls `count` tokens from the sequence's (wrapped) iterator; returns them when done. */
async function pull(sequence: StandInSequence, count: number): Promise<number> {
  const iterator = sequence.asLlama().evaluate([1 as Token]);
  let got = 0;
  for await (const token of iterator) {
    void token;
    got += 1;
    if (got === count) break;
  }
  return got;
}

test("a generation between two tokens holds the others back, and each step releases them in sequence-id order", async () => {
  const { log, lockstep, sequences } = setUp(2);
  const [s0, s1] = sequences as [StandInSequence, StandInSequence];
  // s1 starts first: arrival order must not decide the order in the batch.
  const t1 = lockstep.begin(s1.asLlama(), 10);
  const t0 = lockstep.begin(s0.asLlama(), 10);
  const b = pull(s1, 3);
  const a = pull(s0, 3);
  // First steps (the prompts) hold nobody back.
  await eventually("both prompts are being evaluated", () => s0.pending.length === 1 && s1.pending.length === 1);
  log.length = 0;

  // s0's prompt is done; s1 is still evaluating its own: s0 may take its next step alone
  // only because a prompt holds nobody back.
  s0.finish();
  await eventually("s0 asks for its second token", () => s0.pending.length === 1);
  // s1's prompt is done too; now s0 (in a step) holds s1 back until it asks again.
  s1.finish();
  await eventually("s1 waits at the barrier", () => s1.pending.length === 0 && t1.sampledTokens === 1);
  log.length = 0;
  s0.finish();
  await eventually("both asked for the next step together", () => s0.pending.length === 1 && s1.pending.length === 1);
  assert.deepEqual(log, ["s0 asks", "s1 asks"], "released together, s0 (the lower id) first");

  log.length = 0;
  s1.finish();
  // s1 got its second token first; it must wait for s0's third.
  await eventually("s1 has its second token", () => t1.sampledTokens === 2);
  assert.deepEqual(log, [], "nobody asked while s0 was still in its step");
  s0.finish();
  assert.equal(await a, 3);
  // s0 is done with its iterator, so it holds s1 back no longer.
  await eventually("s1 asks for its third token", () => s1.pending.length === 1);
  s1.finish();
  assert.equal(await b, 3);
  assert.equal(t0.sampledTokens, 3);
  t0.end();
  t1.end();
});

test("a generation that ends, or the lockstep closing, releases the ones waiting for it", async () => {
  const { lockstep, sequences } = setUp(2);
  const [s0, s1] = sequences as [StandInSequence, StandInSequence];
  for (const finish of ["turn end", "close"] as const) {
    const t0 = lockstep.begin(s0.asLlama(), 10);
    const t1 = lockstep.begin(s1.asLlama(), 10);
    const a = pull(s0, 2);
    // s1's consumer takes one token and then does not ask for the next: s1 stays between steps.
    const idle = s1.asLlama().evaluate([1 as Token]);
    const first = idle.next();
    await eventually("both prompts are being evaluated", () => s0.pending.length === 1 && s1.pending.length === 1);
    s1.finish();
    await first;
    s0.finish();
    await eventually("s0 has its first token", () => t0.sampledTokens === 1);
    assert.equal(s0.pending.length, 0, "s0 waits for s1, which is between two steps");
    if (finish === "turn end") t1.end();
    else lockstep.close();
    await eventually(`s0 is released by the ${finish}`, () => s0.pending.length === 1);
    s0.finish();
    assert.equal(await a, 2);
    await idle.return();
    t0.end();
    t1.end();
  }
});

test("a turn samples at most its maxTokens: then its token iterator ends", async () => {
  const { lockstep, sequences } = setUp(1);
  const [s0] = sequences as [StandInSequence];
  const turn = lockstep.begin(s0.asLlama(), 2);
  const iterator = s0.asLlama().evaluate([1 as Token]);
  const first = iterator.next();
  await eventually("the first step is pending", () => s0.pending.length === 1);
  s0.finish();
  assert.equal((await first).done, false);
  const second = iterator.next();
  await eventually("the second step is pending", () => s0.pending.length === 1);
  s0.finish();
  assert.equal((await second).done, false);
  assert.deepEqual(await iterator.next(), { done: true, value: undefined });
  assert.equal(s0.pending.length, 0, "no third step was asked for");
  assert.equal(turn.sampledTokens, 2);
  assert.equal(turn.reachedLimit, true);
  turn.end();
});

test("the cached prefix is where a turn's first evaluation starts, also when the sequence was rebuilt without sampling first", async () => {
  const { lockstep, sequences } = setUp(2);
  const [kept, rebuilt] = sequences as [StandInSequence, StandInSequence];
  // Both held 40 tokens of an earlier prompt and keep 30 of them for the new one.
  kept.nextTokenIndex = 30;
  rebuilt.nextTokenIndex = 30;
  const keptTurn = lockstep.begin(kept.asLlama(), 1);
  const rebuiltTurn = lockstep.begin(rebuilt.asLlama(), 1);

  const keptPull = pull(kept, 1);
  await eventually("the kept sequence evaluates its prompt", () => kept.pending.length === 1);
  kept.finish();
  await keptPull;
  assert.equal(keptTurn.cachedTokens, 30);

  // A sequence that could not erase its tail (a recurrent or sliding-window model) is
  // cleared and filled again from the prompt's start before the generation evaluates.
  rebuilt.nextTokenIndex = 0;
  await rebuilt.asLlama().evaluateWithoutGeneratingNewTokens(Array.from({ length: 30 }, (_, index) => index as Token));
  const rebuiltPull = pull(rebuilt, 1);
  await eventually("the rebuilt sequence evaluates the rest", () => rebuilt.pending.length === 1);
  rebuilt.finish();
  await rebuiltPull;
  assert.equal(rebuiltTurn.cachedTokens, 0, "the 30 tokens evaluated again were not reused");
  keptTurn.end();
  rebuiltTurn.end();
});
