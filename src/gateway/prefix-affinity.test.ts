// The pure parts of prefix routing: the text a request is known by, the hash, the ring
// (stable, balanced, moving only a joining or leaving replica's share) and the bounded-load
// choice. The routing through a real server is in prefix-routing.test.ts.
import { test } from "node:test";
import assert from "node:assert/strict";
import { affinityText, chooseByAffinity, HashRing, loadBound, requestAffinity, ringHash, type AffinityCandidate } from "./prefix-affinity.ts";

const CHAT = "/v1/chat/completions";

/** Keys spread like real ones: hashes of distinct texts. */
const keys = (count: number, tag = "k") => Array.from({ length: count }, (_, n) => ringHash(`${tag}-${n}`));
const members = (...ids: string[]) => ids.map((id) => ({ id, weight: 1 }));
const free = (inFlight = 0, weight = 1): AffinityCandidate => ({ weight, inFlight, eligible: true });

test("the hash of a text is fixed: servers of this version and the next agree on it", () => {
  assert.equal(ringHash("hello"), ringHash("hello"));
  assert.notEqual(ringHash("hello"), ringHash("hello!"));
  // SHA-256("hello") starts 2cf24dba5fb0: pinned, because two servers routing one model by
  // different hashes (a rolling upgrade) would send a conversation to two replicas.
  assert.equal(ringHash("hello"), 0x2cf24dba5fb0);
});

test("a chat is known by its tools, then each message's role and content up to the first user message, cut at `chars`", () => {
  const tools = [{ type: "function", function: { name: "lookup", parameters: { type: "object" } } }];
  const body = {
    tools,
    messages: [
      { role: "system", content: "You answer briefly." },
      { role: "user", content: "Hi" },
    ],
  };
  const text = affinityText(
    CHAT,
    { ...body, messages: [...body.messages, { role: "assistant", content: "Hello" }, { role: "user", content: "More" }] },
    10_000,
  )!;
  assert.ok(text.startsWith(`tools\u0000${JSON.stringify(tools[0])}\u0000`), "tools first, one after the other");
  assert.ok(text.endsWith("system\u0000You answer briefly.\u0000user\u0000Hi"), "then the messages in order, up to the first question");
  assert.equal(affinityText(CHAT, body, 8), 'tools\u0000{"');
  // Other tools are another key, though the messages are the same.
  assert.notEqual(affinityText(CHAT, { ...body, tools: [] }, 10_000), text);
  // Content parts count by their text; an image by its URL.
  const parts = {
    messages: [
      {
        role: "user",
        content: [
          { type: "text", text: "look" },
          { type: "image_url", image_url: { url: "https://x/y.png" } },
        ],
      },
    ],
  };
  assert.equal(affinityText(CHAT, parts, 1000), "user\u0000look\u0000image_url\u0000https://x/y.png");
  // An image inlined as megabytes of data URL: only what fits the key is read.
  const inlined = { messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: `data:image/png;base64,${"A".repeat(5_000_000)}` } }] }] };
  assert.equal(affinityText(CHAT, inlined, 40), "user\u0000image_url\u0000data:image/png;base64,AAA");
});

test("every turn of a conversation has its first turn's key, however short; another first question is another conversation", () => {
  const settings = { routing: "prefix", prefix: { chars: 1024, load_factor: 1.25 } };
  const system = { role: "system", content: "You are brief." };
  const turns = [{ role: "user", content: "First question" }];
  const first = requestAffinity(settings, CHAT, { messages: [system, ...turns] });
  assert.notEqual(first, undefined);
  for (let turn = 2; turn <= 6; turn += 1) {
    turns.push({ role: "assistant", content: `Answer ${turn - 1}` }, { role: "user", content: `Question ${turn}` });
    assert.equal(requestAffinity(settings, CHAT, { messages: [system, ...turns] }), first, `turn ${turn}`);
  }
  // The same system prompt with another opening question, or another system prompt: another conversation.
  assert.notEqual(requestAffinity(settings, CHAT, { messages: [system, { role: "user", content: "Another question" }] }), first);
  assert.notEqual(requestAffinity(settings, CHAT, { messages: [{ role: "system", content: "You are verbose." }, ...turns] }), first);
  // A system prompt longer than `chars` is all the key has: the question after it does not count.
  const long = { role: "system", content: "Rules. ".repeat(300) };
  assert.equal(
    requestAffinity(settings, CHAT, { messages: [long, { role: "user", content: "One" }] }),
    requestAffinity(settings, CHAT, { messages: [long, { role: "user", content: "Two" }] }),
  );
});

test("completions are known by their prompt (the first of several; token ids as numbers); embeddings and least-busy models by nothing", () => {
  assert.equal(affinityText("/v1/completions", { prompt: "Once upon a time" }, 9), "Once upon");
  assert.equal(affinityText("/v1/completions", { prompt: ["alpha", "beta"] }, 100), "alpha");
  assert.equal(affinityText("/v1/completions", { prompt: [1, 2, 3] }, 100), "1,2,3");
  assert.equal(affinityText("/v1/completions", { prompt: [[4, 5], [6]] }, 100), "4,5");
  assert.equal(affinityText("/v1/completions", { prompt: "" }, 100), null);
  assert.equal(affinityText("/v1/embeddings", { input: "text" }, 100), null);
  assert.equal(requestAffinity({ routing: "least-busy" }, CHAT, { messages: [{ role: "user", content: "Hi" }] }), undefined);
});

test("the ring gives every key the same home whatever order its replicas are listed in", () => {
  const one = new HashRing(members("r-a", "r-b", "r-c", "r-d"));
  const other = new HashRing(members("r-d", "r-b", "r-a", "r-c"));
  for (const key of keys(2000)) assert.equal(one.home(key), other.home(key));
});

test("the ring shares keys by weight, within a few percent", () => {
  const even = new HashRing(members("r-a", "r-b"));
  const count = keys(20_000).filter((key) => even.home(key) === "r-a").length;
  assert.ok(Math.abs(count / 20_000 - 0.5) < 0.06, `r-a holds ${count} of 20000 keys`);
  const weighted = new HashRing([
    { id: "r-a", weight: 2 },
    { id: "r-b", weight: 1 },
  ]);
  const heavy = keys(20_000).filter((key) => weighted.home(key) === "r-a").length;
  assert.ok(Math.abs(heavy / 20_000 - 2 / 3) < 0.06, `weight 2 of 3 holds ${heavy} of 20000 keys`);
  // Points follow weight relative to the lightest, up to 1,000 a replica: a weight of ten
  // million builds a ring of 1,100 points (not a billion), where it holds most keys.
  const extreme = new HashRing([
    { id: "r-a", weight: 1e7 },
    { id: "r-b", weight: 1 },
  ]);
  const most = keys(10_000).filter((key) => extreme.home(key) === "r-a").length;
  assert.ok(most / 10_000 > 0.85, `weight 1e7 beside 1 holds ${most} of 10000 keys`);
});

test("a replica that joins takes only its share of keys, and one that leaves gives away only its own", () => {
  const before = new HashRing(members("r-a", "r-b", "r-c"));
  const joined = new HashRing(members("r-a", "r-b", "r-c", "r-d"));
  let moved = 0;
  for (const key of keys(20_000)) {
    if (before.home(key) === joined.home(key)) continue;
    moved += 1;
    assert.equal(joined.home(key), "r-d", "a key that moves, moves to the replica that joined");
  }
  assert.ok(moved / 20_000 > 0.15 && moved / 20_000 < 0.35, `the new replica took ${moved} of 20000 keys (a quarter expected)`);

  const left = new HashRing(members("r-a", "r-c"));
  for (const key of keys(20_000, "leave")) {
    const home = before.home(key);
    if (home !== "r-b") assert.equal(left.home(key), home, "keys of the replicas that stay stay with them");
  }
});

test("bounded load: a busy home passes the request to the next replica on the ring", () => {
  const ring = new HashRing(members("r-a", "r-b", "r-c"));
  const key = keys(1)[0]!;
  const home = ring.home(key)!;
  const next = ring.first(key, (id) => id !== home)!;
  const others = ["r-a", "r-b", "r-c"].filter((id) => id !== home && id !== next);
  const state = (homeLoad: number, nextLoad = 0) =>
    new Map([
      [home, free(homeLoad)],
      [next, free(nextLoad)],
      [others[0]!, free(0)],
    ]);
  assert.equal(chooseByAffinity(ring, key, state(0), 1.25), home, "an idle home");
  // 2 in flight: the bound is ceil(1.25 × 3 / 3) = 2, so a home with 1 takes a second.
  assert.equal(chooseByAffinity(ring, key, state(1, 1), 1.25), home);
  // 3 in flight, all at home: ceil(1.25 × 4 / 3) = 2, and home would hold 4.
  assert.equal(chooseByAffinity(ring, key, state(3), 1.25), next);
  // A home that cannot take it (full, tried, cooling): the next one, in ring order.
  assert.equal(chooseByAffinity(ring, key, new Map([...state(0), [home, { weight: 1, inFlight: 0, eligible: false }]]), 1.25), next);
  // Nobody eligible: no choice here (admission falls back to the least busy, or queues).
  const none = new Map([...state(0)].map(([id, c]) => [id, { ...c, eligible: false }]));
  assert.equal(chooseByAffinity(ring, key, none, 1.25), undefined);
});

test("load_factor 1 keeps replicas within a request of each other, and the bound follows weight", () => {
  const ring = new HashRing(members("r-a", "r-b"));
  for (const key of keys(50)) {
    const home = ring.home(key)!;
    const other = home === "r-a" ? "r-b" : "r-a";
    // 1 in flight at home, 0 at the other: ceil(1 × 2 / 2) = 1, so the second goes to the other.
    const chosen = chooseByAffinity(
      ring,
      key,
      new Map([
        [home, free(1)],
        [other, free(0)],
      ]),
      1,
    );
    assert.equal(chosen, other);
  }
  assert.equal(loadBound(3, 0.5, 1.25), 3, "ceil(1.25 × 4 × 0.5) = ceil(2.5)");
  assert.equal(loadBound(3, 2 / 3, 1.25), 4, "a replica of weight 2 beside one of 1 holds more");
  // 1.1 × 50 is 55.00000000000001 in floating point: still 55.
  assert.equal(loadBound(49, 1, 1.1), 55);
});
