// How a server's addresses are written: host and port for URLs (IPv6 in brackets), the
// URL it listens on, and the URL people can open when it listens on every interface.
import os from "node:os";
import type { AddressInfo } from "node:net";

/** Where people can open the console when no --public-url says: an address bound to every interface is not one to click. */
export function reachableUrl(address: AddressInfo): string {
  const unspecified = address.address === "0.0.0.0" || address.address === "::";
  return unspecified ? `http://${os.hostname()}:${address.port}` : listeningUrl(address);
}

export function formatHostPort(host: string, port: number): string {
  return `${host.includes(":") ? `[${host}]` : host}:${port}`;
}

export function listeningUrl(address: AddressInfo): string {
  return `http://${address.family === "IPv6" ? `[${address.address}]` : address.address}:${address.port}`;
}
