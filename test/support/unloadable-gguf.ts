// A GGUF that passes every check llmgw makes of weights (header, tensor layout, an
// architecture the bundled llama.cpp loads: src/catalog/weights-check.ts, at the door and
// before each start) but that llama.cpp itself refuses to load, because its tokenizer is
// one llama.cpp does not know. It stands for an engine that fails at start with its weights
// present (a GGUF from a newer converter, a build without a feature), the case that parks a
// model. Tests once made engines fail with an engine option nobody knows; the catalog now
// refuses those at the door (src/engines/engine-args-check.ts).
import { GGUFValueType, writeTinyLlamaGguf, type TinyLlamaInfo } from "../../src/gguf/tiny-model.ts";

/** What the bundled engine says when it fails to load such a file (on stderr, kept in the parked reason). */
export const UNLOADABLE_GGUF_COMPLAINT = /unknown tokenizer: 'no-such-tokenizer'/;

export async function writeUnloadableGguf(options: { path: string; seed?: number }): Promise<TinyLlamaInfo> {
  return writeTinyLlamaGguf({
    path: options.path,
    seed: options.seed ?? 1,
    extraMetadata: { "tokenizer.ggml.model": { value: "no-such-tokenizer", type: GGUFValueType.STRING } },
  });
}
