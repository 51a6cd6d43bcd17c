// A mirror as a plain folder, for tests of what reads mirrored weights (the catalog's
// weights check): MIRROR/{model}/{version}/{file}, a file complete once it is there under
// its final name. The real Mirror (src/mirror/) also keeps rows and hashes; what the
// weights check asks of it (`MirrorLocator`) is only this.
import { existsSync } from "node:fs";
import path from "node:path";
import type { MirrorLocator } from "../../src/catalog/weights-check.ts";

export function folderMirror(root: string): MirrorLocator {
  return {
    root,
    check: async (model, version, file) => {
      const found = path.join(root, model, version, ...file.split("/"));
      return existsSync(found)
        ? { kind: "ok", path: found }
        : { kind: "refused", error: new Error(`the mirror has no complete file '${file}' in ${model}/${version}`) };
    },
  };
}
