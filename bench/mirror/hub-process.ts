// The registry side of the mirror benchmark, in its own process so its CPU work (making
// and sending bytes) does not share an event loop with what is measured. It runs the
// stand-in hub (test/support/stand-in-hub.ts: resolve URL → 302 → CDN with Range, as
// huggingface.co does) with one repository holding one synthetic GGUF file of the size
// given in argv[2], whose sha256 is computed here, before the parent starts any timing.
// When ready it sends `{url, repo, path, size, sha256}` to the parent over IPC.
import { startStandInHub, syntheticFile } from "../../test/support/stand-in-hub.ts";

const size = Number(process.argv[2] ?? 1024 ** 3);
const repo = "bench/big-GGUF";
const file = await syntheticFile({ path: "big-Q4_K_M.gguf", size, seed: "llmgw mirror bench" });
const hub = await startStandInHub({ repos: [{ name: repo, files: [file] }] });
process.send?.({ url: hub.url, repo, path: file.path, size, sha256: file.sha256 });
process.on("disconnect", () => {
  void hub.close().then(() => process.exit(0));
});
