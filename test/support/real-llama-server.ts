// The real llama-server for tests: the build `llmgw engine build` made from the llama.cpp
// source node-llama-cpp ships (scripts/provision.sh, which `npm test` runs first, makes it
// once per machine and commit). Tests never build it themselves: 15–25 minutes belong to
// provisioning, not to a test's deadline. Where it is missing, the test fails with a
// sentence saying how to make it.
import { builtLlamaServer } from "../../src/engines/llama-server/llama-cpp-source.ts";

export async function realLlamaServer(): Promise<string> {
  try {
    return await builtLlamaServer();
  } catch (error) {
    throw new Error(
      `${(error as Error).message}. The test suite's provisioning (scripts/provision.sh, run by \`npm test\`) builds it unless LLMGW_SKIP_LLAMA_SERVER_BUILD=1 or LLMGW_SKIP_PROVISION=1 is set.`,
      { cause: error },
    );
  }
}
