// A process that starts one mirror fetch and keeps running, for mirror.test.ts: the test
// kills it with SIGKILL mid-download to check what a crashed server leaves behind and
// what `recover()` makes of it. It reads one JSON object on stdin:
// `{database, schema?, root, fetch: FetchVersionOptions without signal, retryDelayMs}`.
import { text } from "node:stream/consumers";
import { openStore } from "../../src/store/store.ts";
import { Mirror, type FetchVersionOptions } from "../../src/mirror/mirror.ts";

interface ChildInput {
  database: string;
  schema?: string;
  root: string;
  fetch: FetchVersionOptions;
  retryDelayMs: number;
}

const input = JSON.parse(await text(process.stdin)) as ChildInput;
const store = await openStore({ database: input.database, ...(input.schema === undefined ? {} : { schema: input.schema }) });
const mirror = new Mirror({ store, root: input.root, retries: 3, retryDelayMs: input.retryDelayMs });
await mirror.fetchVersion(input.fetch);
await mirror.close();
await store.close();
