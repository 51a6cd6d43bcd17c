// Checks, before a request takes a sequence, that llama.cpp compiles the grammar of each
// function the model may call. LlamaChat (node-llama-cpp 3.21.1) compiles a function's
// parameter grammar only when the model starts calling it, in the middle of the
// generation: a schema llama.cpp refuses would then fail the request with a 500 after the
// stream started, and with tool_choice "auto" only on the day the model decides to call
// that tool. The translation (json-schema-grammar.ts) refuses what it knows llama.cpp
// cannot hold; this catches the rest (for instance a repetition count that, multiplied by
// the size of the repeated rule, exceeds llama.cpp's limits) as a 400 naming the tool.
//
// A compile takes tens of milliseconds for a large schema, and clients send the same
// tools with every request, so the schemas that compiled are remembered, by a hash of
// their JSON text, in a small bounded cache (least recently used out first).
import { createHash } from "node:crypto";
import type { GbnfJsonSchema, Llama } from "node-llama-cpp";
import { BadRequestError } from "../../core/errors.ts";
import type { ToolSpec } from "./structured-wire.ts";

const REMEMBERED = 128;

export class ToolGrammarCheck {
  /** Hashes of parameter schemas that compiled; a Map keeps insertion order for the LRU. */
  private readonly compiled = new Map<string, true>();

  constructor(private readonly llama: Llama) {}

  /** Number of schemas remembered (for tests of the bound). */
  get size(): number {
    return this.compiled.size;
  }

  /**
   * Throws a 400 with param `tools.N.function.parameters` for the first callable tool
   * whose grammar llama.cpp refuses. `documented` holds every tool in request order, so a
   * tool's index there is its index in `tools`.
   */
  async check(callable: readonly ToolSpec[], documented: readonly ToolSpec[]): Promise<void> {
    for (const spec of callable) {
      if (spec.parameters === undefined) continue;
      const key = createHash("sha256").update(JSON.stringify(spec.parameters)).digest("base64");
      if (this.compiled.delete(key)) {
        this.compiled.set(key, true);
        continue;
      }
      try {
        await this.llama.createGrammarForJsonSchema<GbnfJsonSchema>(spec.parameters);
      } catch (error) {
        const param = `tools.${documented.indexOf(spec)}.function.parameters`;
        throw new BadRequestError(
          `Invalid request body: field '${param}': llama.cpp could not build a grammar for the parameters of '${spec.name}' (${error instanceof Error ? error.message : String(error)}); simplify the schema, or serve the model with llama-server or vLLM.`,
          { code: "invalid_schema", param, cause: error },
        );
      }
      this.compiled.set(key, true);
      if (this.compiled.size > REMEMBERED) this.compiled.delete(this.compiled.keys().next().value as string);
    }
  }
}
