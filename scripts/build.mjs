// Compiles src/ to dist/ (tsconfig.build.json), the JavaScript that `llmgw` runs
// (bin/llmgw.js). `npm run build` always compiles; `--if-stale` (npm's `prepare`, and
// `npm test` before its run) compiles only when a source file is newer than the last build,
// so `npm link` or a test run after an unchanged checkout costs one walk of src/ instead of
// a compile. That walk happens here, at build time, never at each start of `llmgw`.
//
// The new build is written beside dist/ and swapped in whole, so a process that is running
// the old one (a test run, a server) never sees a half-written tree, and a failed compile
// leaves the old build as it was.
import { spawnSync } from "node:child_process";
import { existsSync, readdirSync, renameSync, rmSync, statSync, utimesSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("../", import.meta.url));
const dist = path.join(root, "dist");
const stamp = path.join(dist, ".built");
const ifStale = process.argv.includes("--if-stale");

/** The newest modification time of the sources that compile into dist/ (not tests). */
function newestSourceMtime(dir) {
  let newest = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const file = path.join(dir, entry.name);
    if (entry.isDirectory()) newest = Math.max(newest, newestSourceMtime(file));
    else if (entry.name.endsWith(".ts") && !entry.name.endsWith(".test.ts")) newest = Math.max(newest, statSync(file).mtimeMs);
  }
  return newest;
}

function buildIsCurrent() {
  if (!existsSync(stamp)) return false;
  const built = statSync(stamp).mtimeMs;
  const configs = ["tsconfig.json", "tsconfig.build.json"].map((name) => statSync(path.join(root, name)).mtimeMs);
  return built >= Math.max(newestSourceMtime(path.join(root, "src")), ...configs);
}

if (ifStale && buildIsCurrent()) process.exit(0);

let tsc;
try {
  tsc = createRequire(import.meta.url).resolve("typescript/bin/tsc");
} catch {
  console.error("build: TypeScript is not installed, so src/ cannot be compiled to dist/. Run `npm ci` (it installs the dev dependencies and builds).");
  process.exit(1);
}

const next = path.join(root, `dist.next-${process.pid}`);
const old = path.join(root, `dist.old-${process.pid}`);
rmSync(next, { recursive: true, force: true });
const startedAt = Date.now();
process.stderr.write("build: compiling src/ to dist/ ...\n");
const compiled = spawnSync(process.execPath, [tsc, "-p", "tsconfig.build.json", "--outDir", next], { cwd: root, stdio: "inherit" });
if (compiled.status !== 0) {
  rmSync(next, { recursive: true, force: true });
  console.error(`build: FAILED: tsc exited with ${compiled.status ?? compiled.signal}; dist/ is unchanged. Fix the errors above and run \`npm run build\`.`);
  process.exit(1);
}
// The stamp is written last, so a build that was cut off is never taken for a finished one.
// It carries the time the compile started: a source saved during the compile is newer.
const builtStamp = path.join(next, ".built");
writeFileSync(builtStamp, `${new Date(startedAt).toISOString()}\n`);
utimesSync(builtStamp, startedAt / 1000, startedAt / 1000);
if (existsSync(dist)) renameSync(dist, old);
renameSync(next, dist);
rmSync(old, { recursive: true, force: true });
process.stderr.write(`build: dist/ is current (${((Date.now() - startedAt) / 1000).toFixed(1)} s)\n`);
