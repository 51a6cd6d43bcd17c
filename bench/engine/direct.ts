// The "direct" side of the engine benchmark: node-llama-cpp used as its documentation
// shows, with the same settings as `llmgw engine` (CPU only, the prebuilt binary, the
// same threads, one context of `parallel` sequences of `contextPerSequence` tokens, no
// repeat penalty, greedy decoding), in a child process of its own. The parent sends
// `{ type: "round", prompts, maxTokens }` over IPC; this process runs one LlamaCompletion
// per prompt on its own sequence, all at once, and answers with the tokens generated and
// the seconds the round took.
import { getLlama, LlamaCompletion, LlamaLogLevel } from "node-llama-cpp";
import { bindingCmakeOptions } from "../../src/engines/llamacpp/native-binding.ts";

export interface DirectRound {
  type: "round";
  prompts: string[];
  maxTokens: number;
}

export interface DirectResult {
  type: "result";
  tokens: number;
  seconds: number;
}

const [modelPath, parallelText, threadsText, contextText] = process.argv.slice(2);
const parallel = Number(parallelText);
const threads = Number(threadsText);
if (!modelPath || !(parallel > 0) || !(threads > 0)) throw new Error("usage: direct.ts MODEL PARALLEL THREADS CONTEXT_PER_SEQUENCE");

const llama = await getLlama({
  gpu: false,
  build: "never",
  skipDownload: true,
  usePrebuiltBinaries: true,
  // The binding the engine loads: this CPU's local build when there is one (native-binding.ts).
  cmakeOptions: bindingCmakeOptions(),
  progressLogs: false,
  maxThreads: threads,
  logLevel: LlamaLogLevel.warn,
});
const model = await llama.loadModel({ modelPath });
const context = await model.createContext({ contextSize: Number(contextText), sequences: parallel, threads });
const completions = Array.from({ length: parallel }, () => new LlamaCompletion({ contextSequence: context.getSequence() }));

process.on("message", (message: DirectRound) => {
  if (message.type !== "round") return;
  void (async () => {
    const started = performance.now();
    const results = await Promise.all(
      message.prompts.map((prompt, index) =>
        (completions[index] as LlamaCompletion).generateCompletionWithMeta(prompt, { maxTokens: message.maxTokens, temperature: 0, repeatPenalty: false }),
      ),
    );
    const seconds = (performance.now() - started) / 1000;
    // The benchmark's model never ends a reply on its own, so each one has maxTokens tokens.
    for (const result of results)
      if (result.metadata.stopReason !== "maxTokens") throw new Error(`a direct generation ended early: ${result.metadata.stopReason}`);
    process.send?.({ type: "result", tokens: results.length * message.maxTokens, seconds } satisfies DirectResult);
  })();
});
process.on("disconnect", () => {
  void llama.dispose().finally(() => process.exit(0));
});
process.send?.({ type: "ready" });
