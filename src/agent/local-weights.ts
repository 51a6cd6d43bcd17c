// Weights for an agent on the server's own machine (`llmgw up`): the server's mirror folder
// and local files are on this disk, so nothing is copied. A mirrored file is used where
// the mirror keeps it, after the mirror vouches that it is complete and unchanged since it
// was hashed against the published sha256; every file then passes the weights check
// (regular file, not a link, a GGUF llama.cpp loads, all parts of a split present).
import { checkWeightsFile, locateWeights, type MirrorLocator } from "../catalog/weights-check.ts";
import type { Assignment } from "../fleet/agent-protocol.ts";
import type { WeightsProvider } from "./node-agent.ts";

export class LocalWeights implements WeightsProvider {
  constructor(private readonly options: { mirror?: MirrorLocator }) {}

  async prepare(assignment: Assignment, signal: AbortSignal): Promise<{ path: string; verified: boolean }> {
    const located = await locateWeights({ source: assignment.source, modelName: assignment.modelName, ...(this.options.mirror ? { mirror: this.options.mirror } : {}) });
    await checkWeightsFile({ ...located, modelName: assignment.modelName, llamaCpp: assignment.profile.engine === "llamacpp", signal });
    return { path: located.file, verified: assignment.source.kind === "mirror" };
  }
}
