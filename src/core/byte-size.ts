// Sizes as people write them (16m, 512k, 1.5g, 1048576) read into bytes, for flags and for
// the memory an inventory file states. It lives in core/ because both the CLI and the agent
// read sizes, and the agent must not depend on the CLI.
import { BadRequestError } from "./errors.ts";

/** Parses a size like 16m, 512k or 1048576 into bytes (binary units); `flag` names what was given in the error. */
export function parseByteSize(value: string, flag: string): number {
  const match = /^(\d+(?:\.\d+)?)\s*([kmg]?)i?b?$/i.exec(value.trim());
  if (match === null) throw new BadRequestError(`Invalid ${flag} '${value}': use a number of bytes or a size like 512k, 16m, 1g.`);
  const scale = { "": 1, k: 1024, m: 1024 ** 2, g: 1024 ** 3 }[match[2]!.toLowerCase() as "" | "k" | "m" | "g"];
  return Math.floor(Number(match[1]) * scale);
}
