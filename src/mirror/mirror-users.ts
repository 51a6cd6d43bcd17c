// Which catalog models serve weights from a mirrored version: a model whose `source` is
// `{kind: "mirror", model, version, file}`. Deleting such a version would leave those
// models without weights, so the mirror's delete route asks this first (and refuses
// unless forced). The server wires it to its catalog; the mirror only sees the function.
import type { Catalog } from "../catalog/catalog.ts";

/** The names of the catalog models whose source is in `model/version` of the mirror, sorted. */
export type ModelsUsing = (model: string, version: string) => Promise<string[]>;

export function catalogModelsUsing(catalog: Pick<Catalog, "list" | "refresh">): ModelsUsing {
  return async (model, version) => {
    // Another server sharing the database may have added a model since this one last looked.
    await catalog.refresh();
    return catalog
      .list()
      .filter((entry) => {
        const source = entry.definition.source;
        return source?.kind === "mirror" && source.model === model && source.version === version;
      })
      .map((entry) => entry.name)
      .sort();
  };
}
