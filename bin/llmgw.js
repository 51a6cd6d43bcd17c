#!/usr/bin/env node
// Entry point of the `llmgw` command. The sources are TypeScript run through tsx's
// loader, so a fresh clone runs without a build step.
import { register } from "tsx/esm/api";

register();
await import("../src/cli/main.ts");
