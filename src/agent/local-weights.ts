// Weights for an agent on the server's own machine (`llmgw up`): the server's mirror folder
// and local files are on this disk, so nothing is copied. A mirrored file is used where
// the mirror keeps it, after the mirror vouches that it is complete and unchanged since it
// was hashed against the published sha256; a local file whose model's origin published a
// size and sha256 passes the identity check (weights-identity.ts) before every start; every
// file then passes the weights check (regular file, not a link, a GGUF llama.cpp loads,
// all parts of a split present).
import { checkWeightsFile, locateWeights, type MirrorLocator } from "../catalog/weights-check.ts";
import type { Assignment } from "../fleet/agent-protocol.ts";
import type { PreparedWeights, WeightsProvider } from "./node-agent.ts";
import type { WeightsIdentity } from "./weights-identity.ts";

export class LocalWeights implements WeightsProvider {
  constructor(private readonly options: { mirror?: MirrorLocator; identity: WeightsIdentity }) {}

  async prepare(assignment: Assignment, signal: AbortSignal): Promise<PreparedWeights> {
    const located = await locateWeights({
      source: assignment.source,
      modelName: assignment.modelName,
      ...(this.options.mirror ? { mirror: this.options.mirror } : {}),
    });
    let verified = assignment.source.kind === "mirror";
    if (assignment.source.kind === "file") {
      const published = assignment.files.filter((file) => file.sha256 !== null && file.bytes !== null);
      if (published.length > 0)
        await this.options.identity.verify(
          published.map((file) => ({ path: file.file, bytes: file.bytes!, sha256: file.sha256! })),
          signal,
        );
      verified = published.length > 0 && published.length === assignment.files.length;
    }
    await checkWeightsFile({ ...located, modelName: assignment.modelName, llamaCpp: assignment.profile.engine === "llamacpp", signal });
    const adapterPaths = await this.prepareAdapters(assignment, signal);
    return { path: located.file, verified, ...(adapterPaths.length === 0 ? {} : { adapterPaths }) };
  }

  /** The adapters where this disk keeps them, each checked against its pinned size and sha256 before every start. */
  private async prepareAdapters(assignment: Assignment, signal: AbortSignal): Promise<string[]> {
    const paths: string[] = [];
    for (const adapter of assignment.adapters ?? []) {
      const located = await locateWeights({
        source: adapter.source,
        modelName: assignment.modelName,
        ...(this.options.mirror ? { mirror: this.options.mirror } : {}),
      });
      await checkWeightsFile({ file: located.file, modelName: assignment.modelName, param: `adapter ${adapter.name}`, llamaCpp: false, signal });
      if (adapter.sha256 !== null && adapter.bytes !== null)
        await this.options.identity.verify([{ path: located.file, bytes: adapter.bytes, sha256: adapter.sha256 }], signal);
      paths.push(located.file);
    }
    return paths;
  }
}
