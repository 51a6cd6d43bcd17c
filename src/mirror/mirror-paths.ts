// Names in the mirror become file names on disk: DATA_DIR/mirror/{model}/{version}/{file}.
// Every name that reaches the mirror (from the admin API, a node asking for a file, or a
// registry's file list) is checked here, segment by segment, before any path is joined,
// so no name can climb out of the mirror's folder or land on a download in progress.
// The rule itself is the registry's (`pathProblem` and `segmentProblem` in
// src/registry/repo-path.ts), so a path a registry listing passed is one the mirror stores.
// The in-memory key of a file (`fileKey`) lives here too, so the rows and the holder rows,
// which both use it, need not import each other.
import { BadRequestError } from "../core/errors.ts";
import { printable } from "../core/format.ts";
import { PARTIAL_SUFFIX, pathProblem, segmentProblem } from "../registry/repo-path.ts";

export { PARTIAL_SUFFIX, segmentProblem };

/** One key per file (or, with file "", per version) for in-memory maps. */
export function fileKey(model: string, version: string, file: string): string {
  // NUL cannot occur in a checked name, so two different triples never share a key.
  return `${model}\u0000${version}\u0000${file}`;
}

/**
 * Checks a model or version name (one path segment) and returns it unchanged. `param`
 * names the request field for the 400.
 */
export function validateMirrorKey(kind: "model" | "version", value: unknown, param: string = kind): string {
  const text = typeof value === "string" ? value : String(value);
  const problem = typeof value === "string" ? segmentProblem(value) : "it is not a string";
  if (problem !== null) {
    throw new BadRequestError(
      `Invalid mirror ${kind} '${printable(text)}': ${problem}. A ${kind} is one path segment: letters, digits and punctuation, ` +
        `without '/', '\\', '..' or control characters (for example ${kind === "model" ? "'bartowski--Llama-3.2-1B-Instruct-GGUF'" : "'0123456789ab'"}).`,
      { code: "invalid_path", param },
    );
  }
  return text;
}

/**
 * Checks a file path inside a mirrored version (a repository path such as
 * `Q2_K/x-00001-of-00002.gguf`) and returns it unchanged: the registry's path rule, so
 * every segment passes `segmentProblem`, the path is relative and does not end in `.partial`.
 */
export function validateMirrorFile(value: unknown, param = "file"): string {
  const text = typeof value === "string" ? value : String(value);
  const problem = pathProblem(value);
  if (problem !== null) {
    throw new BadRequestError(
      `Invalid mirror file path '${printable(text)}': ${problem}. Use a path relative to the repository root with '/' between folders, ` +
        `each segment a plain name (for example 'Q4_K_M/model-Q4_K_M.gguf').`,
      { code: "invalid_path", param },
    );
  }
  return text;
}
