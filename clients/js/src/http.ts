/**
 * Reaching the server: where it is ({@link ClientOptions}), the token sent
 * with each request, one JSON call, and reading a refusal's
 * `{error, message}` body into a {@link TidingsError}.
 *
 * @module
 */

import { TidingsError } from "./codes.js";
import type { Filter } from "./types.js";

/** Where the server is and how to reach it. */
export interface ClientOptions {
  /** The server's base URL; in a page, the page's own origin by default. */
  url?: string | URL;
  /**
   * A bearer token (JWT), when the server has authentication on; or a
   * function returning one, called before every request and (re)connect,
   * so a stream whose token expired (`system.token_expired` on a stream,
   * `stream.token_expired` on a device connection) goes on under a fresh
   * one. A fixed token that expires ends the stream with `unauthorized`.
   */
  token?: string | (() => string | Promise<string>);
  /** A `fetch` to use instead of the global one. */
  fetch?: typeof fetch;
}

export function baseUrl(options: ClientOptions): URL {
  if (options.url !== undefined) return new URL(String(options.url));
  const here = (globalThis as { location?: { origin: string } }).location;
  if (here) return new URL(here.origin);
  throw new TypeError("tidings: no url given, and not in a page");
}

export function endpoint(options: ClientOptions, path: string, query: Record<string, string | undefined> = {}): URL {
  const url = new URL(path, baseUrl(options));
  for (const [name, value] of Object.entries(query)) if (value !== undefined) url.searchParams.set(name, value);
  return url;
}

export function fetcher(options: ClientOptions): typeof fetch {
  const f = options.fetch ?? globalThis.fetch;
  if (!f) throw new TypeError("tidings: no fetch available");
  return f.bind(globalThis);
}

/** The token to send now: the fixed one, or a fresh one from the function. */
export async function currentToken(options: ClientOptions): Promise<string | undefined> {
  const t = options.token;
  return typeof t === "function" ? await t() : t;
}

export async function headers(options: ClientOptions, extra: Record<string, string> = {}): Promise<Record<string, string>> {
  const token = await currentToken(options);
  return token ? { ...extra, authorization: `Bearer ${token}` } : extra;
}

export function filterQuery(filter: Filter): string | undefined {
  return Object.keys(filter).length ? JSON.stringify(filter) : undefined;
}

/** Reads a refusal's `{error, message}` body into a {@link TidingsError}. */
export async function refusal(response: Response): Promise<TidingsError> {
  let body: unknown = undefined;
  try {
    body = await response.json();
  } catch {
    // Not JSON (a proxy's page, say): the status alone speaks.
  }
  const b = (body ?? {}) as { error?: unknown; message?: unknown };
  const code = typeof b.error === "string" ? b.error : `http_${response.status}`;
  const message = typeof b.message === "string" ? b.message : response.statusText;
  return new TidingsError(response.status, code, message, body);
}

export async function call<T>(options: ClientOptions, method: string, url: URL, body?: unknown): Promise<T> {
  const init: RequestInit = { method, headers: await headers(options, body === undefined ? {} : { "content-type": "application/json" }) };
  if (body !== undefined) init.body = JSON.stringify(body);
  const response = await fetcher(options)(url, init);
  if (!response.ok) throw await refusal(response);
  return (response.status === 204 ? undefined : await response.json()) as T;
}

/** A refusal the same request would meet again: not retried. */
export function isFinal(status: number): boolean {
  return status >= 400 && status < 500 && status !== 408 && status !== 429;
}

/** A handler's own exception or a lost connection: shown, not fatal. */
export function report(error: unknown): void {
  if (typeof console !== "undefined" && !(error instanceof DOMException && error.name === "AbortError")) console.warn("tidings:", error);
}
