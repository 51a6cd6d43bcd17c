// The admin API as the end-to-end tests call it: one request with an admin key, the status
// and the parsed body back (null for an empty one). `url` and `key` are read at each call,
// so a test can make the caller before its server has started.
// biome-ignore lint/suspicious/noExplicitAny: tests read the many answer shapes of the admin API through this one helper.
export type AdminAnswer = { status: number; body: any };

export function adminCaller(server: () => { url: string; key: string }): (method: string, pathname: string, body?: unknown) => Promise<AdminAnswer> {
  return async (method, pathname, body) => {
    const { url, key } = server();
    const response = await fetch(url + pathname, {
      method,
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    });
    const text = await response.text();
    return { status: response.status, body: text === "" ? null : JSON.parse(text) };
  };
}
