// The llmgw version, read once from package.json so there is one place to change it.
import { readFileSync } from "node:fs";

const manifest = JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8")) as { version: string };

export const LLMGW_VERSION: string = manifest.version;
