// Local paths on ctl's command line. ctl runs in the user's shell and the server in its
// own folder, maybe on another machine, so `./x.gguf` or `~/models` must mean ctl's folder
// and home: ctl resolves them and sends absolute paths. Repository ids (`owner/name`) and
// `file:` URLs go as they are.
import { existsSync } from "node:fs";
import { isLocalSource, localSourcePath } from "../registry/local-source.ts";

/**
 * A `repo` argument (`model plan`, `mirror fetch`): a local file or folder becomes an
 * absolute path; a repository id stays. A bare name without '/' cannot be a repository id
 * (those are owner/name), so one that exists here is taken as a local path too.
 */
export function absoluteRepoArgument(value: string, cwd: string = process.cwd()): string {
  if (value.startsWith("file:")) return value;
  const bareLocalName = !value.includes("/") && existsSync(localSourcePath(value, cwd));
  return isLocalSource(value) || bareLocalName ? localSourcePath(value, cwd) : value;
}

/** A path that can only be local (`model add --gguf`): absolute, with `~` as this user's home. */
export function absoluteFilePath(value: string, cwd: string = process.cwd()): string {
  return localSourcePath(value, cwd);
}
