// The outside programs some tests drive (HAProxy, Chromium), found before a test uses them.
// A missing one fails the test with a sentence naming the program and the command that
// installs it, instead of a bare `spawn haproxy ENOENT` from deep inside the test.
// scripts/provision.sh, which `npm test` runs first, installs them on a machine of this
// project's kind; this is what a test says where that could not happen.
import { accessSync, constants } from "node:fs";
import path from "node:path";

export interface OutsideTool {
  /** What the program is called in messages. */
  name: string;
  /** Executable names looked up on PATH, or absolute paths tried as they are. */
  candidates: string[];
  /** The Debian package that provides it. */
  debianPackage: string;
  /** An environment variable that may name the executable instead (tried first). */
  envVariable?: string;
}

export const HAPROXY: OutsideTool = { name: "HAProxy", candidates: ["haproxy"], debianPackage: "haproxy" };
export const CHROMIUM: OutsideTool = {
  name: "Chromium",
  candidates: ["/usr/bin/chromium", "/usr/bin/chromium-browser"],
  debianPackage: "chromium",
  envVariable: "CHROMIUM_PATH",
};

function isExecutable(file: string): boolean {
  try {
    accessSync(file, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

/** Where Debian installs system programs (haproxy among them), which a user's PATH may lack. */
const SYSTEM_DIRS = ["/usr/sbin", "/sbin"];

/**
 * The executable's path, or an Error whose message says what is missing and how to install
 * it. Names are looked up on PATH, then in `systemDirs`.
 */
export function findTool(tool: OutsideTool, env: NodeJS.ProcessEnv = process.env, systemDirs: readonly string[] = SYSTEM_DIRS): string {
  const fromEnv = tool.envVariable === undefined ? undefined : env[tool.envVariable];
  const tried: string[] = [];
  const candidates = fromEnv !== undefined && fromEnv !== "" ? [fromEnv, ...tool.candidates] : tool.candidates;
  const onPath = (env.PATH ?? "").split(path.delimiter).filter((dir) => dir !== "");
  const searchPath = [...onPath, ...systemDirs.filter((dir) => !onPath.includes(dir))];
  for (const candidate of candidates) {
    const files = candidate.includes("/") ? [candidate] : searchPath.map((dir) => path.join(dir, candidate));
    for (const file of files) if (isExecutable(file)) return file;
    tried.push(candidate.includes("/") ? candidate : `${candidate} on PATH${systemDirs.length > 0 ? ` and in ${systemDirs.join(", ")}` : ""}`);
  }
  const orEnv = tool.envVariable === undefined ? "" : `, or set ${tool.envVariable} to its executable`;
  throw new Error(
    `${tool.name} is not installed (looked for ${tried.join(", ")}); this test needs it. ` +
      `Install it with: apt-get install -y ${tool.debianPackage}${orEnv} (npm test runs scripts/provision.sh, which does this as root).`,
  );
}
