// External profiles' api_key, sealed at rest (issue 25). Clients send `api_key`; the
// catalog stores `api_key_sealed` in its place, sealed with the server's secret box (the
// data dir's key on SQLite, the cluster secret's on PostgreSQL: the box that seals engine
// keys and notification channels), and the plain key is opened only where the external
// replica that calls the upstream server is made (fleet/external-replicas.ts). Rows an
// older llmgw wrote still hold a plain api_key: the catalog seals them when it reads them
// (`sealPlainApiKeys`), because migrations run before the box is known and may not call it.
import type { SecretBox } from "../core/secret-box.ts";
import type { ModelDefinition, Profile } from "./model-schema.ts";

/**
 * The definition as it is stored: every api_key replaced by api_key_sealed. A key equal to
 * the one `previous` (the stored profiles) holds keeps its sealed value, so a PATCH that
 * sends the same key again is no change (sealing twice gives two different texts).
 */
export function sealApiKeys(definition: ModelDefinition, box: SecretBox, previous: readonly Profile[] = []): ModelDefinition {
  if (!definition.profiles.some((profile) => profile.api_key !== undefined)) return definition;
  return {
    ...definition,
    profiles: definition.profiles.map(({ api_key: plain, ...profile }) => {
      if (plain === undefined) return profile;
      const stored = previous.find((p) => p.name === profile.name && p.engine === "external")?.api_key_sealed;
      const api_key_sealed = stored !== undefined && box.open(stored) === plain ? stored : box.seal(plain);
      return { ...profile, api_key_sealed };
    }),
  };
}

/**
 * The key an external profile's requests carry, or null when it has none, or when it was
 * sealed with another key (the data dir's server.secret was replaced, or a server that ran
 * alone was given a cluster secret): the upstream then answers 401 and the model's key has
 * to be set again.
 */
export function openApiKey(profile: Profile, box: SecretBox): string | null {
  if (profile.api_key_sealed !== undefined) return box.open(profile.api_key_sealed);
  return profile.api_key ?? null;
}

/** Whether an external profile has a sealed key this box cannot open. */
export function apiKeySealedElsewhere(profile: Profile, box: SecretBox): boolean {
  return profile.api_key_sealed !== undefined && box.open(profile.api_key_sealed) === null;
}

/**
 * A stored definition's JSON with its plain api_keys sealed, or null when it holds none.
 * It works on the JSON as stored rather than through the schema, so a row this version
 * cannot otherwise read (a newer llmgw's) gets its keys sealed too, and nothing else in
 * the row changes (no defaults are filled in).
 */
export function sealPlainApiKeys(definitionJson: string, box: SecretBox): { json: string; profiles: string[] } | null {
  let definition: unknown;
  try {
    definition = JSON.parse(definitionJson);
  } catch {
    return null;
  }
  const profiles = typeof definition === "object" && definition !== null ? (definition as { profiles?: unknown }).profiles : undefined;
  if (!Array.isArray(profiles)) return null;
  const sealedProfiles: string[] = [];
  const sealed = profiles.map((profile: unknown) => {
    if (typeof profile !== "object" || profile === null || !("api_key" in profile) || typeof profile.api_key !== "string") return profile;
    const { api_key: plain, ...rest } = profile as { api_key: string; name?: unknown };
    sealedProfiles.push(String(rest.name));
    return { ...rest, api_key_sealed: box.seal(plain) };
  });
  if (sealedProfiles.length === 0) return null;
  return { json: JSON.stringify({ ...(definition as object), profiles: sealed }), profiles: sealedProfiles };
}
