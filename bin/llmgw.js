#!/usr/bin/env node
// Entry point of the `llmgw` command. A fresh install compiles the TypeScript sources to
// dist/ (`npm run build`, run by `prepare`), and that JavaScript runs when it is at least
// as new as every source file. Otherwise (an edited checkout, or no build) the sources run
// through tsx's loader, so nobody ever runs stale code. LLMGW_FROM_SOURCE=1 forces tsx.
import { existsSync, readdirSync, statSync } from "node:fs";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("../", import.meta.url));
const stamp = `${root}dist/.built`;

function newestSourceMtime(dir) {
  let newest = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = `${dir}/${entry.name}`;
    if (entry.isDirectory()) newest = Math.max(newest, newestSourceMtime(path));
    else if (entry.name.endsWith(".ts")) newest = Math.max(newest, statSync(path).mtimeMs);
  }
  return newest;
}

const compiledIsCurrent =
  process.env.LLMGW_FROM_SOURCE !== "1" && existsSync(stamp) && statSync(stamp).mtimeMs >= newestSourceMtime(`${root}src`);

if (compiledIsCurrent) {
  await import("../dist/cli/main.js");
} else {
  const { register } = await import("tsx/esm/api");
  register();
  await import("../src/cli/main.ts");
}
