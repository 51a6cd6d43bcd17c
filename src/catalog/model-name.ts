// The shape of a model's names (its name, aliases, adapters' served names): they appear in
// URLs and in `model` fields, so they stay printable and short. Its own module so that the
// model schema and the adapter schema can both use it without importing each other.
import { z } from "zod";

/** Names and aliases appear in URLs and in `model` fields; keep them printable and short. */
export const MODEL_NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$/;

export const modelName = z.string().regex(MODEL_NAME_PATTERN, "must be 1-128 characters of letters, digits and . _ : / @ + -, starting with a letter or digit");
