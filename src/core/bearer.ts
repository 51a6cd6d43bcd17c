// Reads the key from an `Authorization: Bearer <key>` header, the one way every llmgw
// API (and every engine) takes a key.
export function bearerToken(header: string | undefined): string | undefined {
  if (header === undefined) return undefined;
  const match = /^Bearer\s+(.+)$/i.exec(header);
  const token = match?.[1]?.trim();
  return token === "" ? undefined : token;
}
