// The bundled engine's lanes: a llama.cpp context with its parallel sequences, its decode
// lockstep and its sequence pool. The base model has one lane, made at load and kept for
// the life of the engine; each combination of LoRA adapter scales that requests ask for
// gets a lane of its own, made on first use and kept while there is room for it.
//
// Why a context per combination (node-llama-cpp 3.21.1): adapters are a property of a
// context there (the `lora` option of createContext, applied to every sequence of the
// context), and llama.cpp has no per-sequence adapters. llama-server instead switches
// the one context's adapters before each batch and batches only slots that agree; that
// needs the decode loop, which node-llama-cpp keeps to itself. A lane per combination
// gives each its own KV cache, so a cached prefix evaluated with one adapter is never
// reused under another. (llama-server at 80fb11ac clears a slot's cache when a request's
// adapters differ from the slot's, but not when a request without `lora` follows one
// with adapters: that request then reuses the prefix the adapter evaluated.)
//
// Adapter files are loaded once, when the base lane is made with every adapter at scale
// 0 (as llama-server's `--lora-scaled PATH:0`): that checks them at start, and llama.cpp
// leaves a zero-scale adapter out of the graph, so the base decodes exactly as without
// them. node-llama-cpp keeps loaded adapters on the model until it is disposed, so later
// lanes reuse them and cost only their context: KV cache and compute buffers, as much as
// the base lane's. The CPU threads are not multiplied: every lane asks node-llama-cpp's
// thread splitter for all of the engine's --threads as its minimum, so lanes decoding at
// the same moment take turns at full width. (With a plain number the splitter divides
// the threads between the contexts decoding at the moment, and as the engine decodes on
// one libuv thread, ENGINE_THREAD_POOL_SIZE in engine-launch.ts, their steps would still
// run one after the other, each on half the cores.)
//
// The bound: at most `maxAdapterLanes` adapter lanes exist. A request for a new
// combination when they are all there replaces the least recently used lane that no
// request holds or waits for; when every one is in use, the request is refused with a
// retryable 503 (adapter_contexts_busy) rather than queued behind a context that may stay
// busy for long.
import type { LlamaContext, LlamaModel } from "node-llama-cpp";
import { BadRequestError, UnavailableError } from "../../core/errors.ts";
import type { Logger } from "../../core/log.ts";
import type { DecodeBatchMeter } from "./decode-batches.ts";
import { DecodeLockstep } from "./decode-lockstep.ts";
import { trimSampledDistributions } from "./sampled-distributions.ts";
import type { AdapterScale } from "./openai-wire.ts";
import { SequencePool } from "./sequence-pool.ts";

/** Adapter contexts kept at once unless --lora-contexts says otherwise. */
export const DEFAULT_ADAPTER_CONTEXTS = 2;

/** A context and its sequences, lent to one request per sequence. */
export interface Lane {
  /** "" for the base; otherwise the adapters and scales, as "id:scale" by id. */
  readonly key: string;
  readonly context: LlamaContext;
  readonly pool: SequencePool;
  readonly lockstep: DecodeLockstep;
}

/** What every lane of an engine shares: sequences of the same size, so a request fits any lane alike. */
export interface LaneShape {
  model: LlamaModel;
  /** Tokens per sequence. */
  contextSize: number;
  sequences: number;
  threads: number;
  batchMeter: DecodeBatchMeter;
}

/** Makes a lane: its context (with these adapters at these scales), sequences, lockstep and pool. */
export async function createLane(shape: LaneShape, key: string, adapters: { filePath: string; scale: number }[]): Promise<Lane> {
  const context = await shape.model.createContext({
    contextSize: shape.contextSize,
    sequences: shape.sequences,
    threads: { ideal: shape.threads, min: shape.threads },
    batching: { itemPrioritizationStrategy: shape.batchMeter.shareBatch },
    ...(adapters.length > 0 ? { lora: { adapters } } : {}),
  });
  try {
    trimSampledDistributions(context);
  } catch (error) {
    await context.dispose();
    throw error;
  }
  const sequences = Array.from({ length: shape.sequences }, () => context.getSequence());
  const lockstep = new DecodeLockstep();
  for (const sequence of sequences) lockstep.attach(sequence);
  return { key, context, lockstep, pool: new SequencePool(sequences) };
}

/** Which lane a request runs on: the base (key "") or an adapter combination. */
export interface LaneChoice {
  key: string;
  /** The adapters with a non-zero scale, by id. */
  adapters: { filePath: string; scale: number }[];
}

const BASE: LaneChoice = { key: "", adapters: [] };

interface AdapterLaneEntry {
  ready: Promise<Lane>;
  lane: Lane | null;
  /** Requests that hold or wait for one of its sequences, or wait for it to be made. */
  users: number;
  lastUsed: number;
}

export interface AdapterLanesOptions {
  base: Lane;
  shape: LaneShape;
  /** The adapter files in id order (--lora). */
  adapterPaths: readonly string[];
  /** Most adapter lanes kept at once (--lora-contexts). */
  maxAdapterLanes: number;
  logger: Logger;
  /** Makes a lane; tests may count or fail it. Default createLane. */
  create?: typeof createLane;
}

export class AdapterLanes {
  private readonly entries = new Map<string, AdapterLaneEntry>();
  private readonly create: typeof createLane;
  private tick = 0;
  private closedWith: Error | null = null;

  constructor(private readonly options: AdapterLanesOptions) {
    this.create = options.create ?? createLane;
  }

  get base(): Lane {
    return this.options.base;
  }

  /** The adapter lanes that exist now (made or being made). */
  get adapterLaneCount(): number {
    return this.entries.size;
  }

  /**
   * Checks a request's `lora` list against the adapters this engine loaded and picks its
   * lane: none, an empty list or only zero scales is the base (llama-server's rule: listed
   * adapters apply at their scale, unlisted ones at 0, no list means the start scales).
   */
  choose(lora: readonly AdapterScale[] | undefined): LaneChoice {
    if (lora === undefined || lora.length === 0) return BASE;
    const paths = this.options.adapterPaths;
    if (paths.length === 0) {
      throw new BadRequestError("Invalid request body: field 'lora': this engine serves no LoRA adapters (it was started without --lora); leave lora out.", {
        code: "invalid_field",
        param: "lora",
      });
    }
    const seen = new Set<number>();
    lora.forEach(({ id }, index) => {
      const param = `lora.${index}.id`;
      if (id >= paths.length) {
        throw new BadRequestError(
          `Invalid request body: field '${param}': there is no adapter ${id}; this engine serves ${paths.length} adapter${paths.length === 1 ? "" : "s"} (ids 0 to ${paths.length - 1}).`,
          { code: "invalid_field", param },
        );
      }
      if (seen.has(id)) throw new BadRequestError(`Invalid request body: field '${param}': adapter ${id} is listed twice.`, { code: "invalid_field", param });
      seen.add(id);
    });
    const applied = lora.filter(({ scale }) => scale !== 0).sort((a, b) => a.id - b.id);
    if (applied.length === 0) return BASE;
    return {
      key: applied.map(({ id, scale }) => `${id}:${scale}`).join(","),
      adapters: applied.map(({ id, scale }) => ({ filePath: paths[id] as string, scale })),
    };
  }

  /** The lane for a choice, made now if needed; every acquire is matched by one `release`. */
  async acquire(choice: LaneChoice): Promise<Lane> {
    if (this.closedWith) throw this.closedWith;
    if (choice.key === "") return this.options.base;
    const existing = this.entries.get(choice.key);
    const entry = existing ?? this.startLane(choice);
    entry.users += 1;
    try {
      const lane = await entry.ready;
      if (this.closedWith) throw this.closedWith;
      return lane;
    } catch (error) {
      entry.users -= 1;
      throw error;
    }
  }

  release(lane: Lane): void {
    if (lane.key === "") return;
    const entry = this.entries.get(lane.key);
    if (!entry || entry.lane !== lane) return;
    entry.users -= 1;
    entry.lastUsed = ++this.tick;
  }

  /** Refuses new requests and stops every lane's waiters (the engine is stopping); the contexts go with the model. */
  close(reason: Error): void {
    this.closedWith = reason;
    for (const lane of [this.options.base, ...[...this.entries.values()].map((entry) => entry.lane)]) {
      lane?.pool.close(reason);
      lane?.lockstep.close();
    }
  }

  private startLane(choice: LaneChoice): AdapterLaneEntry {
    let making: Promise<void> = Promise.resolve();
    if (this.entries.size >= this.options.maxAdapterLanes) {
      const victim = this.leastRecentlyUsedIdle();
      if (!victim) {
        throw new UnavailableError(
          `This engine keeps at most ${this.options.maxAdapterLanes} adapter contexts (--lora-contexts) and all of them are serving requests; retry shortly, or raise --lora-contexts.`,
          { code: "adapter_contexts_busy", retryAfterSeconds: 1 },
        );
      }
      this.entries.delete(victim.key);
      making = this.retire(victim);
    }
    const ready = this.makeLane(choice, making);
    const entry: AdapterLaneEntry = { ready, lane: null, users: 0, lastUsed: ++this.tick };
    // Registered before any acquirer awaits `ready`, so the entry is settled before they go on.
    ready.then(
      (lane) => {
        entry.lane = lane;
        this.options.logger.info({ adapters: choice.key, lanes: this.entries.size }, "adapter context made");
      },
      () => {
        if (this.entries.get(choice.key) === entry) this.entries.delete(choice.key);
      },
    );
    this.entries.set(choice.key, entry);
    return entry;
  }

  private async makeLane(choice: LaneChoice, making: Promise<void>): Promise<Lane> {
    // The retired lane's memory is released before the new context asks for its own.
    await making;
    try {
      return await this.create(this.options.shape, choice.key, choice.adapters);
    } catch (error) {
      this.options.logger.error({ err: error, adapters: choice.key }, "could not make an adapter context");
      throw new UnavailableError(
        `llama.cpp could not make a context for adapters ${choice.key} (${error instanceof Error ? error.message : String(error)}); retry later, or lower --lora-contexts or --ctx-size.`,
        { code: "adapter_context_failed", retryAfterSeconds: 1, cause: error },
      );
    }
  }

  private leastRecentlyUsedIdle(): Lane | null {
    let best: AdapterLaneEntry | null = null;
    for (const entry of this.entries.values()) {
      if (entry.users === 0 && entry.lane && (!best || entry.lastUsed < best.lastUsed)) best = entry;
    }
    return best?.lane ?? null;
  }

  private async retire(lane: Lane): Promise<void> {
    const reason = new UnavailableError("The adapter context was replaced; retry.", { retryAfterSeconds: 1 });
    lane.pool.close(reason);
    lane.lockstep.close();
    await lane.context.dispose().catch((error: unknown) => this.options.logger.warn({ err: error, adapters: lane.key }, "disposing an adapter context failed"));
    this.options.logger.info({ adapters: lane.key }, "adapter context replaced");
  }
}
