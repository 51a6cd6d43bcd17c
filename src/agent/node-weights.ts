// Weights on a node of the fleet (`llmgw agent`). Mirrored weights come to the node's
// cache from the server's mirror with the node's credential (weight-cache.ts: resumed,
// sha256-checked, one download shared by the replicas that need it); before every engine
// start each file passes the identity check (weights-identity.ts: a regular file, not a
// link, the published size and sha256; a file whose stamp is unchanged since it was
// hashed is not hashed again). A file source is a path on the node itself (the same
// machine as the server, or shared storage); it is checked against the sha256 its model's
// origin published when there is one, and refused otherwise only for what the weights
// check finds (missing, a link, not a GGUF llama.cpp loads).
import path from "node:path";
import { checkWeightsFile } from "../catalog/weights-check.ts";
import { listPeftFolder } from "../catalog/peft-folder.ts";
import type { AssignedAdapter, Assignment } from "../fleet/agent-protocol.ts";
import type { PreparedWeights, WeightsProvider } from "./node-agent.ts";
import type { CacheFileSpec, WeightCache } from "./weight-cache.ts";
import { type ExpectedWeightsFile, WeightsIdentityError, type WeightsIdentity } from "./weights-identity.ts";

export class NodeWeights implements WeightsProvider {
  private readonly holding = new Set<string>();

  constructor(private readonly options: { cache: WeightCache; identity: WeightsIdentity }) {}

  held(): string[] {
    return [...this.holding];
  }

  async prepare(assignment: Assignment, signal: AbortSignal): Promise<PreparedWeights> {
    const { source } = assignment;
    const llamaCpp = assignment.profile.engine === "llamacpp";
    if (source.kind === "mirror") {
      const specs: CacheFileSpec[] = assignment.files.map((file) => ({
        model: source.model,
        version: source.version,
        file: file.file,
        // The mirror serves only complete files it hashed, so both are known.
        bytes: file.bytes ?? 0,
        sha256: file.sha256 ?? "",
      }));
      let paths = await this.options.cache.ensure(specs, { signal });
      const expected = () => paths.map((file, index) => ({ path: file, bytes: specs[index]!.bytes, sha256: specs[index]!.sha256 }));
      try {
        await this.options.identity.verify(expected(), signal);
      } catch (error) {
        // A cached copy changed between the fetch and now: fetch it again (the cache replaces it), then check once more.
        if (!(error instanceof WeightsIdentityError)) throw error;
        paths = await this.options.cache.ensure(specs, { signal });
        await this.options.identity.verify(expected(), signal);
      }
      this.holding.add(`mirror:${source.model}/${source.version}`);
      const first = paths[0]!;
      if (llamaCpp) await checkWeightsFile({ file: first, modelName: assignment.modelName, param: "source", llamaCpp: true, signal });
      // The projector came with the weights (the last of `files`), fetched and verified the same way.
      const projectorIndex = source.projector === undefined ? -1 : assignment.files.findIndex((file) => file.file === source.projector);
      const projectorPath = projectorIndex === -1 ? undefined : paths[projectorIndex];
      const adapterPaths = await this.prepareAdapters(assignment, signal);
      // vLLM loads a folder: the version's folder in the cache.
      return {
        path: llamaCpp ? first : path.dirname(first),
        verified: true,
        ...(projectorPath === undefined ? {} : { projectorPath }),
        ...(adapterPaths.length === 0 ? {} : { adapterPaths }),
      };
    }
    const published = assignment.files.filter((file) => file.sha256 !== null && file.bytes !== null);
    if (published.length > 0)
      await this.options.identity.verify(
        published.map((file) => ({ path: file.file, bytes: file.bytes!, sha256: file.sha256! })),
        signal,
      );
    if (llamaCpp) await checkWeightsFile({ file: source.path, modelName: assignment.modelName, param: "source.path", llamaCpp: true, signal });
    if (source.projector !== undefined)
      await checkWeightsFile({ file: source.projector, modelName: assignment.modelName, param: "source.projector", llamaCpp: false, signal });
    const adapterPaths = await this.prepareAdapters(assignment, signal);
    return {
      path: llamaCpp ? source.path : path.dirname(source.path),
      verified: published.length === assignment.files.length,
      ...(source.projector === undefined ? {} : { projectorPath: source.projector }),
      ...(adapterPaths.length === 0 ? {} : { adapterPaths }),
    };
  }

  /**
   * The adapters' paths on this node, in the model's order, each checked as weights are: a
   * mirrored one fetched to the cache, and every pinned one hashed against its size and
   * sha256 before the engine starts (a changed file refuses the start with both values). A
   * vLLM adapter folder must hold exactly the files the server pinned: a file added to it
   * (another adapter_model.bin, say) would change what vLLM loads as surely as a changed one.
   */
  private async prepareAdapters(assignment: Assignment, signal: AbortSignal): Promise<string[]> {
    const adapters = assignment.adapters ?? [];
    if (adapters.length === 0) return [];
    const paths: string[] = [];
    const pinned: ExpectedWeightsFile[] = [];
    for (const adapter of adapters) {
      if (adapter.source.kind === "mirror") {
        const spec: CacheFileSpec = { ...adapter.source, bytes: adapter.bytes ?? 0, sha256: adapter.sha256 ?? "" };
        const [cached] = await this.options.cache.ensure([spec], { signal });
        paths.push(cached!);
        pinned.push({ path: cached!, bytes: spec.bytes, sha256: spec.sha256 });
        continue;
      }
      const folder = adapter.source.path;
      paths.push(folder);
      if (adapter.files !== undefined) {
        pinned.push(...(await checkFolderFiles(folder, adapter.files, `Adapter '${adapter.name}' of model '${assignment.modelName}'`)));
      } else if (adapter.sha256 !== null && adapter.bytes !== null) {
        await checkWeightsFile({ file: folder, modelName: assignment.modelName, param: `adapter ${adapter.name}`, llamaCpp: false, signal });
        pinned.push({ path: folder, bytes: adapter.bytes, sha256: adapter.sha256 });
      } else {
        // From a server that pinned no folder files: at least the config must be there.
        const config = path.join(folder, "adapter_config.json");
        await checkWeightsFile({ file: config, modelName: assignment.modelName, param: `adapter ${adapter.name}`, llamaCpp: false, signal });
      }
    }
    await this.options.identity.verify(pinned, signal);
    return paths;
  }
}

/** The folder's files against the pinned list: the same names (none missing, none added), then each file's pin to verify. */
async function checkFolderFiles(folder: string, files: NonNullable<AssignedAdapter["files"]>, what: string): Promise<ExpectedWeightsFile[]> {
  const here = new Set((await listPeftFolder(folder, what)).map((entry) => entry.file));
  const wanted = new Set(files.map((entry) => entry.file));
  const missing = [...wanted].filter((file) => !here.has(file));
  const added = [...here].filter((file) => !wanted.has(file));
  if (missing.length > 0 || added.length > 0) {
    const parts = [
      ...(missing.length > 0 ? [`${missing.join(", ")} ${missing.length === 1 ? "is" : "are"} missing`] : []),
      ...(added.length > 0 ? [`${added.join(", ")} ${added.length === 1 ? "was" : "were"} added`] : []),
    ];
    throw new WeightsIdentityError(
      `${what}: the folder ${folder} on this node is not the one the server pinned (${parts.join("; ")}). Make it the same on every node (copy the adapter folder again), or update the model so the server pins it anew.`,
      { code: "weights_changed", file: folder },
    );
  }
  return files.map((entry) => ({ path: path.join(folder, entry.file), bytes: entry.bytes, sha256: entry.sha256 }));
}
