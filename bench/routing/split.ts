// How evenly prefix routing's ring splits conversations over two replicas
// (`npx tsx bench/routing/split.ts`): for 8, 32 and 128 conversations, the share of 2,000
// random rings (two replicas with fresh ids, as each placement makes) on which the smaller
// replica gets at least 0.75 of the larger one's conversations: the balance goal of
// bench/routing/prefix.ts, for routing by prefix alone (no request ever in flight).
import { randomBytes } from "node:crypto";
import { HashRing, ringHash } from "../../src/gateway/prefix-affinity.ts";

const RINGS = 2000;
for (const conversations of [8, 32, 128]) {
  let even = 0;
  for (let trial = 0; trial < RINGS; trial += 1) {
    const ids = [0, 1].map(() => `r-${randomBytes(6).toString("hex")}`);
    const ring = new HashRing(ids.map((id) => ({ id, weight: 1 })));
    const counts = new Map<string, number>();
    for (let n = 0; n < conversations; n += 1) {
      const home = ring.home(ringHash(`ring ${trial} conversation ${n}`))!;
      counts.set(home, (counts.get(home) ?? 0) + 1);
    }
    const [first = 0, second = 0] = [...counts.values()];
    if (Math.min(first, second) / Math.max(first, second) >= 0.75) even += 1;
  }
  process.stdout.write(`${conversations} conversations: within 25% on ${((even / RINGS) * 100).toFixed(1)}% of ${RINGS} rings\n`);
}
