// Summarizes a V8 CPU profile (`node --cpu-prof`, as `run.ts --cpu-prof llmgw|floor|all`
// writes them) in the terms the gateway benchmark needs: where a proxy process spends its
// busy time, by owner (a Node.js core module, an npm package, an llmgw source file) and by
// function, with self time (the function's own code) and inclusive time (it and what it
// called) for llmgw's own functions. Idle time is left out of the percentages.
//
// Usage: `npx tsx bench/gateway/profile-summary.ts FILE.cpuprofile [--top N] [--skip S]
// [--requests N]`. The process's start (loading and compiling modules through tsx, which
// takes seconds on a busy machine) is left out: everything before the first HTTP request
// it parsed, or before S seconds with --skip. --requests adds a column of µs per request.
import { readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number; columnNumber: number };
  children?: number[];
}

interface CpuProfile {
  nodes: ProfileNode[];
  startTime: number;
  endTime: number;
  samples: number[];
  timeDeltas: number[];
}

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");

/** Who owns a frame: `node:<module>`, an npm package, a path under the repository, or a V8 pseudo-frame. */
function ownerOf(frame: ProfileNode["callFrame"]): string {
  const { url, functionName } = frame;
  if (url === "") return functionName.startsWith("(") ? functionName : "(native)";
  if (url.startsWith("node:")) return url;
  const file = url.startsWith("file://") ? fileURLToPath(url) : url;
  const inModules = file.lastIndexOf("/node_modules/");
  if (inModules !== -1) {
    const rest = file.slice(inModules + "/node_modules/".length).split("/");
    return rest[0]!.startsWith("@") ? `${rest[0]}/${rest[1]}` : rest[0]!;
  }
  return path.relative(ROOT, file);
}

function label(frame: ProfileNode["callFrame"]): string {
  return `${frame.functionName || "(anonymous)"} ${ownerOf(frame)}:${frame.lineNumber + 1}`;
}

/** Microseconds from the profile's start to the first sample inside node:http's request parser callback. */
function firstRequestAt(profile: CpuProfile, byId: Map<number, ProfileNode>, parent: Map<number, number>): number {
  let at = 0;
  for (let i = 0; i < profile.samples.length; i += 1) {
    at += profile.timeDeltas[i] ?? 0;
    for (let id: number | undefined = profile.samples[i]; id !== undefined; id = parent.get(id)) {
      if (byId.get(id)!.callFrame.functionName === "parserOnIncoming") return at;
    }
  }
  return 0;
}

export function summarizeProfile(profile: CpuProfile, options: { top?: number; skipS?: number; requests?: number } = {}): string {
  const top = options.top ?? 25;
  const byId = new Map(profile.nodes.map((node) => [node.id, node]));
  const parent = new Map<number, number>();
  for (const node of profile.nodes) for (const child of node.children ?? []) parent.set(child, node.id);
  const self = new Map<number, number>();
  const skipUs = options.skipS === undefined ? firstRequestAt(profile, byId, parent) : options.skipS * 1e6;
  // timeDeltas[i] is the time between sample i-1 and sample i: charge it to sample i-1's frame.
  let at = 0;
  for (let i = 0; i < profile.samples.length; i += 1) {
    at += profile.timeDeltas[i] ?? 0;
    if (at < skipUs) continue;
    const delta = profile.timeDeltas[i + 1] ?? 0;
    const id = profile.samples[i]!;
    self.set(id, (self.get(id) ?? 0) + delta);
  }
  const totalUs = [...self.values()].reduce((sum, value) => sum + value, 0);
  let idleUs = 0;
  for (const [id, us] of self) if (byId.get(id)!.callFrame.functionName === "(idle)") idleUs += us;
  const busyUs = totalUs - idleUs;
  const pct = (us: number) => `${((100 * us) / busyUs).toFixed(1).padStart(5)}%`;
  const ms = (us: number) =>
    `${(us / 1000).toFixed(0).padStart(7)} ms${options.requests === undefined ? "" : ` ${(us / options.requests).toFixed(1).padStart(6)} µs/req`}`;

  // Inclusive time: each node's self time plus its subtree's.
  const inclusive = new Map<number, number>();
  const visit = (id: number): number => {
    const node = byId.get(id)!;
    let sum = self.get(id) ?? 0;
    for (const child of node.children ?? []) sum += visit(child);
    inclusive.set(id, sum);
    return sum;
  };
  const roots = profile.nodes.filter((node) => !parent.has(node.id));
  for (const root of roots) visit(root.id);

  const owners = new Map<string, number>();
  const functions = new Map<string, number>();
  for (const [id, us] of self) {
    const frame = byId.get(id)!.callFrame;
    if (frame.functionName === "(idle)") continue;
    owners.set(ownerOf(frame), (owners.get(ownerOf(frame)) ?? 0) + us);
    functions.set(label(frame), (functions.get(label(frame)) ?? 0) + us);
  }
  // Inclusive per llmgw function, counting a function once per stack (recursion-safe).
  const ownInclusive = new Map<string, number>();
  const walk = (id: number, onStack: Set<string>) => {
    const node = byId.get(id)!;
    const key = label(node.callFrame);
    const mine = /^(\.\.\/[^/]+\/)?(src|dist)\//.test(ownerOf(node.callFrame)) && !onStack.has(key);
    if (mine) {
      ownInclusive.set(key, (ownInclusive.get(key) ?? 0) + inclusive.get(id)!);
      onStack.add(key);
    }
    for (const child of node.children ?? []) walk(child, onStack);
    if (mine) onStack.delete(key);
  };
  for (const root of roots) walk(root.id, new Set());

  const sorted = (map: Map<string, number>) => [...map.entries()].sort((a, b) => b[1] - a[1]).slice(0, top);
  const lines = [
    `profile: ${((profile.endTime - profile.startTime) / 1e6).toFixed(1)} s wall${skipUs > 0 ? ` (first ${(skipUs / 1e6).toFixed(1)} s left out)` : ""}, ${(busyUs / 1e6).toFixed(2)} s busy (idle ${(idleUs / 1e6).toFixed(2)} s); percentages are of busy time` +
      (options.requests === undefined ? "" : `; ${options.requests} requests, ${(busyUs / options.requests).toFixed(1)} µs busy per request`),
    "",
    "self time by owner:",
    ...sorted(owners).map(([owner, us]) => `  ${pct(us)} ${ms(us)}  ${owner}`),
    "",
    "self time by function:",
    ...sorted(functions).map(([name, us]) => `  ${pct(us)} ${ms(us)}  ${name}`),
    "",
    "inclusive time of llmgw's own functions (src/ or dist/):",
    ...sorted(ownInclusive).map(([name, us]) => `  ${pct(us)} ${ms(us)}  ${name}`),
  ];
  return lines.join("\n");
}

const file = process.argv[2];
if (file === undefined || file.startsWith("--")) {
  process.stderr.write("usage: npx tsx bench/gateway/profile-summary.ts FILE.cpuprofile [--top N]\n");
  process.exit(2);
}
const numberFlag = (name: string): number | undefined => {
  const index = process.argv.indexOf(name);
  return index === -1 ? undefined : Number(process.argv[index + 1]);
};
process.stdout.write(
  `${summarizeProfile(JSON.parse(readFileSync(file, "utf8")) as CpuProfile, {
    top: numberFlag("--top"),
    skipS: numberFlag("--skip"),
    requests: numberFlag("--requests"),
  })}\n`,
);
