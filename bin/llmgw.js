#!/usr/bin/env node
// Entry point of the `llmgw` command. It runs the compiled JavaScript in dist/, which
// `npm ci` (through `prepare`) and `npm run build` produce, and which `npm test` brings up
// to date before a run (scripts/build.mjs). Nothing is checked or compiled here, so a start
// costs only the import of dist/.
//
// LLMGW_FROM_SOURCE=1 runs the TypeScript sources through tsx instead (a dev dependency):
// for a developer who wants an edit to take effect without a build. A checkout with no dist/
// at all falls back to the same when tsx is installed.
import { existsSync } from "node:fs";

const compiled = new URL("../dist/cli/main.js", import.meta.url);
const fromSource = process.env.LLMGW_FROM_SOURCE === "1" || !existsSync(compiled);

if (!fromSource) {
  await import(compiled.href);
} else {
  let register;
  try {
    ({ register } = await import("tsx/esm/api"));
  } catch {
    process.stderr.write(
      process.env.LLMGW_FROM_SOURCE === "1"
        ? "llmgw: LLMGW_FROM_SOURCE=1 runs the TypeScript sources through tsx, a dev dependency that is not installed here: run `npm ci`, or unset LLMGW_FROM_SOURCE.\n"
        : "llmgw: dist/ is missing (the compiled JavaScript): run `npm run build` in the llmgw folder (`npm ci` does it too).\n",
    );
    process.exit(1);
  }
  register();
  await import("../src/cli/main.ts");
}
