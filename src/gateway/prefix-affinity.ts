// Prefix affinity (a model's `routing: "prefix"`): which replica a request belongs to, by
// the start of its prompt. An engine that still holds a prompt's start in a sequence skips
// evaluating it again (the bundled engine and llama-server pick the sequence with the
// longest common prefix; vLLM caches prefix blocks), so the next turn of a conversation,
// or the next request behind the same long system prompt, answers far sooner on the
// replica that served the last one.
//
// This module is pure: the text a request is known by, its hash, the hash ring and the
// bounded-load choice. Admission (admission.ts) calls it with the replicas and their
// in-flight counts. The rules:
// - The key is the first `chars` characters of the start of the prompt that every turn of
//   a conversation repeats: for a chat, the tools, then each message's role and content in
//   order up to and including the first user message (the system prompt and the question
//   that opened the conversation, or an agent's task); for a completion, the prompt. So
//   every turn of a conversation has its first turn's key, however short that turn was, and
//   conversations behind one system prompt are told apart by their first question when the
//   system prompt is shorter than `chars`.
// - Consistent hashing: each replica puts points on a ring (POINTS_PER_WEIGHT for the
//   lightest weight among them, more in proportion, at hashes of its id), and a key
//   belongs to the first replica clockwise from the key's hash. A replica that joins takes only the keys that land before its own points; one
//   that leaves gives only its own keys to the next ones. The ring depends on nothing but
//   the replica ids and weights, which every server reads from the same rows, so two
//   servers send a prefix to the same replica (while the bound below, which each server
//   judges by its own requests in flight, does not pass it on).
// - Bounded load (consistent hashing with bounded loads, Mirrokni, Thorup and Zadimoghaddam,
//   2016): walking clockwise, a request takes the first replica that has a free slot and
//   whose requests in flight, this one counted, stay within
//   ceil(load_factor × (requests in flight at the replicas it may use + 1) × its share of
//   their weight).
//   A busy home sends the request to the next replica on the ring, which is also where its
//   prefix goes if the home leaves. The rounding up is the published rule: a few requests
//   at once may share their home rather than be split up (two on one replica of two is
//   within 1.25 × the mean of one).
import { createHash } from "node:crypto";
import { PREFIX_ROUTING_DEFAULTS } from "../catalog/model-schema.ts";

/**
 * Ring points of a replica of the smallest weight among the ring's: with 100, each of a few
 * replicas holds its share of keys within a few percent. Heavier ones get more in proportion,
 * at most MAX_POINTS each, so a weight of 10,000 beside one of 1 costs no more than
 * building a ring of a few replicas (the ring is built on a request, after a change).
 */
const POINTS_PER_WEIGHT = 100;
const MAX_POINTS = 1000;

/** A position on the ring, or a key's hash: the first 48 bits of a SHA-256, exact in a JavaScript number. */
export function ringHash(text: string): number {
  return createHash("sha256").update(text).digest().readUIntBE(0, 6);
}

/** Separates the parts of the key text, so ["ab", "c"] and ["a", "bc"] differ. */
const SEPARATOR = "\u0000";

/**
 * The text a request is routed by: the start of its prompt, at most `chars` characters, or
 * null when the request has no prompt to speak of (embeddings, an empty prompt).
 */
export function affinityText(path: string, body: Readonly<Record<string, unknown>>, chars: number): string | null {
  const key = new KeyText(chars);
  if (path === "/v1/chat/completions") {
    if (Array.isArray(body.tools) && body.tools.length > 0) {
      key.add("tools");
      // Tool by tool, so a long list is serialised only as far as the key reaches.
      for (const tool of body.tools) if (!key.full) key.add(JSON.stringify(tool));
    }
    const messages = Array.isArray(body.messages) ? body.messages : [];
    for (const message of messages) {
      if (key.full) break;
      if (typeof message !== "object" || message === null) continue;
      const { role, content, tool_calls: toolCalls } = message as { role?: unknown; content?: unknown; tool_calls?: unknown };
      key.add(String(role));
      addContent(key, content);
      if (toolCalls !== undefined && toolCalls !== null && !key.full) key.add(JSON.stringify(toolCalls));
      // What follows the first question differs from turn to turn; the key must not.
      if (role === "user") break;
    }
  } else if (path === "/v1/completions") {
    // A list of prompts is routed by its first (they all go to one replica anyway); token ids as numbers.
    const prompt: unknown = body.prompt;
    const first: unknown = Array.isArray(prompt) && typeof prompt[0] !== "number" ? prompt[0] : prompt;
    if (typeof first === "string") key.add(first);
    else if (Array.isArray(first)) key.add(first.slice(0, chars).join(","));
  }
  return key.text();
}

/**
 * A message's content: a string as it is, parts one after the other, an image by its URL.
 * Only as much as the key still takes is looked at: an image inlined as a data URL of
 * megabytes is never serialised whole.
 */
function addContent(key: KeyText, content: unknown): void {
  if (typeof content === "string") key.add(content);
  else if (Array.isArray(content)) {
    for (const part of content) {
      if (key.full) return;
      if (typeof part !== "object" || part === null) key.add(JSON.stringify(part));
      else if (typeof part.text === "string") key.add(part.text);
      else if (typeof part.image_url === "object" && part.image_url !== null && typeof part.image_url.url === "string") {
        key.add(`image_url${SEPARATOR}${part.image_url.url.slice(0, key.room)}`);
      } else key.add(JSON.stringify(part));
    }
  } else if (content !== undefined && content !== null) key.add(JSON.stringify(content));
}

/** Collects key parts, each after a separator, until `chars` characters are there; a part is cut to the room left. */
class KeyText {
  private text_ = "";

  constructor(private readonly chars: number) {}

  get full(): boolean {
    return this.text_.length >= this.chars;
  }

  /** Characters the key still takes. */
  get room(): number {
    return Math.max(0, this.chars - this.text_.length);
  }

  add(part: string): void {
    if (this.full) return;
    const separated = this.text_ === "" ? part : `${SEPARATOR}${part}`;
    this.text_ += separated.slice(0, this.room);
  }

  text(): string | null {
    return this.text_ === "" ? null : this.text_;
  }
}

/** A replica as the ring sees it. */
export interface RingMember {
  id: string;
  weight: number;
}

/** The consistent-hash ring over a model's replicas. Built once per change of its replicas; the same members give the same ring in any order. */
export class HashRing {
  private readonly positions: number[];
  private readonly owners: string[];
  readonly size: number;

  constructor(members: readonly RingMember[]) {
    const points: Array<{ position: number; id: string }> = [];
    const lightest = Math.min(...members.map((member) => member.weight));
    for (const member of members) {
      const count = Math.min(MAX_POINTS, Math.max(1, Math.round((POINTS_PER_WEIGHT * member.weight) / lightest)));
      for (let index = 0; index < count; index += 1) points.push({ position: ringHash(`${member.id}#${index}`), id: member.id });
    }
    // Ties (two ids at one position, as good as never) are broken by id, so the order does not depend on the members' order.
    points.sort((a, b) => a.position - b.position || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
    this.positions = points.map((point) => point.position);
    this.owners = points.map((point) => point.id);
    this.size = new Set(this.owners).size;
  }

  /**
   * The first member clockwise from `hash` that `accept` takes, each member asked at most
   * once; undefined when it takes none.
   */
  first(hash: number, accept: (id: string) => boolean): string | undefined {
    const count = this.positions.length;
    if (count === 0) return undefined;
    const asked = new Set<string>();
    for (let step = 0, index = this.firstAtOrAfter(hash); step < count && asked.size < this.size; step += 1, index = (index + 1) % count) {
      const id = this.owners[index]!;
      if (asked.has(id)) continue;
      asked.add(id);
      if (accept(id)) return id;
    }
    return undefined;
  }

  /** The member that owns `hash` when every member is free: its home. */
  home(hash: number): string | undefined {
    return this.first(hash, () => true);
  }

  private firstAtOrAfter(hash: number): number {
    let low = 0;
    let high = this.positions.length;
    while (low < high) {
      const middle = (low + high) >>> 1;
      if (this.positions[middle]! < hash) low = middle + 1;
      else high = middle;
    }
    return low === this.positions.length ? 0 : low;
  }
}

/** A replica's state for one choice. */
export interface AffinityCandidate {
  weight: number;
  inFlight: number;
  /** It may take this request: a free slot, not tried by it already, not cooling down after a failure. */
  eligible: boolean;
}

/**
 * The replica for a request whose key hashes to `hash`: the first on the ring that is
 * eligible and within the load bound (see the top of this file). Ring members missing from
 * `candidates` are passed over; the candidates' in-flight requests make the mean, eligible
 * or not. Undefined when none qualifies: the caller falls back to the least busy.
 */
export function chooseByAffinity(ring: HashRing, hash: number, candidates: ReadonlyMap<string, AffinityCandidate>, loadFactor: number): string | undefined {
  let inFlight = 0;
  let weight = 0;
  for (const candidate of candidates.values()) {
    inFlight += candidate.inFlight;
    weight += candidate.weight;
  }
  if (weight <= 0) return undefined;
  return ring.first(hash, (id) => {
    const candidate = candidates.get(id);
    if (candidate === undefined || !candidate.eligible) return false;
    return candidate.inFlight + 1 <= loadBound(inFlight, candidate.weight / weight, loadFactor);
  });
}

/** The most requests a replica holding `share` of the weight may have in flight once this one is added. */
export function loadBound(inFlight: number, share: number, loadFactor: number): number {
  // The epsilon keeps a product that floating point puts a hair above a whole number
  // (1.1 × 50 = 55.00000000000001) from rounding up to the next one.
  return Math.ceil(loadFactor * (inFlight + 1) * share - 1e-9);
}

/** A model's prefix settings as the gateway reads them. */
export interface PrefixRouted {
  routing: string;
  prefix?: { chars: number; load_factor: number } | undefined;
}

/** The hash a request of a prefix-routed model is routed by; undefined for other models and for requests without a prompt. */
export function requestAffinity(definition: PrefixRouted, path: string, body: Readonly<Record<string, unknown>>): number | undefined {
  if (definition.routing !== "prefix") return undefined;
  const text = affinityText(path, body, definition.prefix?.chars ?? PREFIX_ROUTING_DEFAULTS.chars);
  return text === null ? undefined : ringHash(text);
}
