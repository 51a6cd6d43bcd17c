// Makes the parallel sequences of one llama.cpp context decode their next tokens in one
// batch, as llama-server's slots do, and counts the tokens each generation samples.
//
// Why this is needed (node-llama-cpp 3.21.1): LlamaContext does batch the decodes that
// its sequences have queued when a dispatch starts, but a dispatch starts one event-loop
// turn (setImmediate) after the first decode is queued, and its loop immediately decodes
// whatever else is queued when one batch ends. Each sequence samples its token on the
// thread pool, so the samples of one batch finish at different moments; the first
// generation to get its token then queues its next decode while the others are still
// handling theirs, is dispatched alone, and from then on the sequences take turns: two
// sequences share no decode step at all. On a memory-bound model, where one step costs
// the same for one token as for two, two parallel generations then reach only ~1.16× the
// tokens/s of one (bench/engine/README.md has the figures).
//
// The fix is a barrier in front of every decode step: a generation that wants its next
// token waits until every other running generation wants one too, and then they all
// queue their decodes in the same microtask run, so the context's next dispatch takes
// them as one batch. Generations that are not between two tokens hold nobody back: one
// evaluating its prompt (which may take several batches; the others keep generating in
// the same batches as its chunks), and one that is setting up or finishing. They are
// released in the order of their sequence ids, which llama.cpp decodes fastest.
//
// The barrier sits in `sequence.evaluate`, the one call through which LlamaChat and
// LlamaCompletion get every generated token, so it also sees each sampled token: that is
// the count a generation reports (llama-server's tokens_predicted, including the end of
// generation token and the tokens of a stop sequence), whatever the text callbacks
// released or held back. A generation that asked for logprobs has its tokens evaluated
// through `evaluateWithMetadata` with probabilities (or only the sampled token's, when no
// alternatives are wanted) instead (the same iterator that `evaluate` itself unwraps),
// and the turn keeps each step's distribution next to its token; the others take the
// plain path and pay nothing for it.
//
// A logprobs turn still holds the others at the barrier for as long as its step takes,
// and copying a whole distribution out of llama.cpp makes that step longer. Releasing the
// others without it would not help them: that copy runs on the JavaScript thread, which
// they need too to queue their next decode, and the logprobs turn would then decode in a
// batch of its own, losing the shared batches this module exists for. So the cost is cut
// at its source instead (sampledOnly below, sampled-distributions.ts).
import type { LlamaContextSequence, Token } from "node-llama-cpp";

type Phase =
  /** Not generating tokens: before its first token iterator, or after one ended. */
  | "outside"
  /** Between two steps of a token iterator: handling the last token, about to ask for the next. */
  | "idle"
  /** Waiting at the barrier for the next step. */
  | "waiting"
  /** Evaluating a new input (a prompt): may take several batches; nobody waits for it. */
  | "prefill"
  /** Decoding and sampling one step with the others. */
  | "step";

/** One generation on one sequence, from the moment it holds the sequence until it ends. */
export interface GenerationTurn {
  /** Tokens sampled so far (every token the sequence generated, held back or not). */
  readonly sampledTokens: number;
  /** Those tokens, in order. */
  readonly tokens: readonly Token[];
  /** True once the turn sampled its `maxTokens` and refused to sample more. */
  readonly reachedLimit: boolean;
  /**
   * Prompt tokens the sequence already held from an earlier request and did not evaluate
   * again (the prompt cache: sequence-pool.ts): where its first evaluation started.
   */
  readonly cachedTokens: number;
  /**
   * With `keepDistribution`: for each of `tokens`, what it kept of the distribution the
   * token was sampled from (token → probability); otherwise empty.
   */
  readonly distributions: ReadonlyArray<TokenDistribution | undefined>;
  /** Leaves the lockstep; the others stop waiting for this generation. */
  end(): void;
}

type Evaluate = LlamaContextSequence["evaluate"];
type EvaluateWithoutSampling = LlamaContextSequence["evaluateWithoutGeneratingNewTokens"];
type TokenIterator = AsyncGenerator<Token, void, Token | Token[] | undefined>;

/** Token → probability of one sampling step, in node-llama-cpp's order (most likely first). */
export type TokenDistribution = ReadonlyMap<Token, number>;

export interface TurnOptions {
  /**
   * Sample with probabilities, and keep what this returns of each step's distribution.
   * A full distribution is as long as the vocabulary (150k entries for some models), so
   * the caller keeps only what it will report.
   */
  keepDistribution?: (token: Token, distribution: TokenDistribution) => TokenDistribution;
  /**
   * With keepDistribution: only the sampled token's probability is wanted (top_logprobs
   * 0), so llama.cpp is asked for that alone (its "confidence", the same figure), and the
   * distribution is that one token. The whole distribution is as long as the vocabulary
   * under greedy decoding, and copying it out of the native side costs tens of
   * milliseconds per token for a 150k vocabulary (sampled-distributions.ts).
   */
  sampledOnly?: boolean;
}

class Turn implements GenerationTurn {
  phase: Phase = "outside";
  readonly tokens: Token[] = [];
  readonly distributions: Array<TokenDistribution | undefined> = [];
  reachedLimit = false;
  cachedTokens = 0;
  /** Set by the first evaluation, which starts after the prefix the sequence kept. */
  evaluated = false;
  release: (() => void) | null = null;

  constructor(
    readonly maxTokens: number,
    readonly keepDistribution: TurnOptions["keepDistribution"],
    readonly sampledOnly: boolean,
    private readonly onEnd: (turn: Turn) => void,
  ) {}

  get sampledTokens(): number {
    return this.tokens.length;
  }

  end(): void {
    this.onEnd(this);
  }
}

/**
 * At a turn's first evaluation LlamaChat and LlamaCompletion have just erased what
 * differs from the new prompt, so the sequence's next index is the length of the prefix
 * it kept from an earlier request.
 */
function noteCachedPrefix(turn: Turn, sequence: LlamaContextSequence): void {
  if (turn.evaluated) return;
  turn.evaluated = true;
  turn.cachedTokens = sequence.nextTokenIndex;
}

export class DecodeLockstep {
  private readonly turns = new Map<LlamaContextSequence, Turn>();
  /** Attached sequences in the order of their llama.cpp sequence ids. */
  private readonly attached: LlamaContextSequence[] = [];
  private closed = false;

  /**
   * Routes the sequence's `evaluate` through the barrier; once per sequence, before any
   * generation uses it, in the order the context handed them out (getSequence gives ids
   * 0, 1, 2, ...). The sequence object is this engine's own (never shared), and
   * LlamaChat and LlamaCompletion call `evaluate` on it for every token.
   */
  attach(sequence: LlamaContextSequence): void {
    this.attached.push(sequence);
    const original: Evaluate = sequence.evaluate.bind(sequence);
    const wrapped: Evaluate = (tokens, options) => {
      const turn = this.turns.get(sequence);
      if (!turn) return original(tokens, options);
      noteCachedPrefix(turn, sequence);
      const inner = !turn.keepDistribution
        ? original(tokens, options)
        : turn.sampledOnly
          ? withDistributions(turn, sequence.evaluateWithMetadata(tokens, { confidence: true }, options))
          : withDistributions(turn, sequence.evaluateWithMetadata(tokens, { probabilities: true }, options));
      return this.evaluateInStep(turn, inner);
    };
    Object.defineProperty(sequence, "evaluate", { value: wrapped, configurable: true, writable: true });
    // Not every prompt reaches `evaluate` first. A sequence that cannot erase a tail of
    // its cache (sliding-window or recurrent models) is rebuilt from a checkpoint or from
    // nothing by evaluating tokens without sampling, and LlamaChat does the same before a
    // thought-segment checkpoint: whichever of the two comes first in a turn says where
    // the reused prefix ended, so the rebuilt tokens are not counted as cached.
    const evaluateQuietly: EvaluateWithoutSampling = sequence.evaluateWithoutGeneratingNewTokens.bind(sequence);
    const wrappedQuietly: EvaluateWithoutSampling = (tokens, options) => {
      const turn = this.turns.get(sequence);
      if (turn) noteCachedPrefix(turn, sequence);
      return evaluateQuietly(tokens, options);
    };
    Object.defineProperty(sequence, "evaluateWithoutGeneratingNewTokens", { value: wrappedQuietly, configurable: true, writable: true });
  }

  /**
   * Starts a generation on an attached sequence. It samples at most `maxTokens`: past
   * that its token iterators end instead of sampling. (LlamaCompletion holds a byte token
   * that is not yet a whole character without checking its maxTokens, and would sample
   * one token more than asked; LlamaChat checks first and never reaches the limit here.)
   */
  begin(sequence: LlamaContextSequence, maxTokens: number, options: TurnOptions = {}): GenerationTurn {
    const turn = new Turn(maxTokens, options.keepDistribution, options.sampledOnly === true, (ended) => {
      if (this.turns.get(sequence) !== ended) return;
      this.turns.delete(sequence);
      this.releaseIfAllReady();
    });
    this.turns.set(sequence, turn);
    return turn;
  }

  /** Stops holding anyone back (the context is being disposed). */
  close(): void {
    this.closed = true;
    for (const turn of this.turns.values()) turn.release?.();
  }

  /**
   * The sequence's own token iterator, with a wait at the barrier before each step. The
   * first step of an iterator evaluates its input tokens (the prompt, or what is left of
   * it after the cached prefix) and is a prefill.
   */
  private async *evaluateInStep(turn: Turn, inner: TokenIterator): TokenIterator {
    let input: Token | Token[] | undefined;
    let first = true;
    try {
      for (;;) {
        if (turn.sampledTokens >= turn.maxTokens) {
          turn.reachedLimit = true;
          return;
        }
        await this.arrive(turn);
        turn.phase = first ? "prefill" : "step";
        first = false;
        const next = await inner.next(input);
        turn.phase = "idle";
        if (next.done) return;
        turn.tokens.push(next.value);
        input = yield next.value;
      }
    } finally {
      turn.phase = "outside";
      // This generation may have been the one the others waited for.
      this.releaseIfAllReady();
      await inner.return();
    }
  }

  /**
   * Waits at the barrier. The generation that arrives last releases everyone, itself
   * included, through the same promise as the others, so that all of them continue in the
   * order of release (see releaseAll).
   */
  private arrive(turn: Turn): Promise<void> {
    turn.phase = "waiting";
    const released = new Promise<void>((resolve) => {
      turn.release = () => {
        turn.release = null;
        resolve();
      };
    });
    // Checked once this generation awaits `released`, like the others already do.
    queueMicrotask(() => this.releaseIfAllReady());
    return released;
  }

  /** Ready: no running generation is between steps or in the middle of one. */
  private allReady(): boolean {
    for (const turn of this.turns.values()) if (turn.phase === "idle" || turn.phase === "step") return false;
    return true;
  }

  private releaseIfAllReady(): void {
    if (this.closed || this.allReady()) this.releaseAll();
  }

  private releaseAll(): void {
    // Each released generation queues its decode within this microtask run, before the
    // context's dispatch (scheduled with setImmediate) takes the batch, and in the order
    // released, since all of them take the same path from here to the queue. That order
    // is the sequence ids': llama.cpp decodes a batch whose sequences come in descending
    // order about 1.5 times slower (4 sequences: 45 against 30 ms a step here).
    for (const sequence of this.attached) this.turns.get(sequence)?.release?.();
  }
}

/**
 * The tokens of a metadata iterator, keeping each one's distribution on the turn. The
 * distribution is pushed here and the token by `evaluateInStep` right after, in the same
 * step, so the two arrays stay aligned.
 */
async function* withDistributions(
  turn: Turn,
  inner: AsyncGenerator<{ token: Token; probabilities?: Map<Token, number>; confidence?: number }, void, undefined | Token | Token[]>,
): TokenIterator {
  let input: Token | Token[] | undefined;
  try {
    for (;;) {
      const next = await inner.next(input);
      if (next.done) return;
      const { token, probabilities, confidence } = next.value;
      turn.distributions.push(turn.keepDistribution?.(token, probabilities ?? new Map([[token, confidence ?? 0]])));
      input = yield next.value.token;
    }
  } finally {
    await inner.return();
  }
}
