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
export declare function baseUrl(options: ClientOptions): URL;
export declare function endpoint(options: ClientOptions, path: string, query?: Record<string, string | undefined>): URL;
export declare function fetcher(options: ClientOptions): typeof fetch;
/** The token to send now: the fixed one, or a fresh one from the function. */
export declare function currentToken(options: ClientOptions): Promise<string | undefined>;
export declare function headers(options: ClientOptions, extra?: Record<string, string>): Promise<Record<string, string>>;
export declare function filterQuery(filter: Filter): string | undefined;
/** Reads a refusal's `{error, message}` body into a {@link TidingsError}. */
export declare function refusal(response: Response): Promise<TidingsError>;
export declare function call<T>(options: ClientOptions, method: string, url: URL, body?: unknown): Promise<T>;
/** A refusal the same request would meet again: not retried. */
export declare function isFinal(status: number): boolean;
/** A handler's own exception or a lost connection: shown, not fatal. */
export declare function report(error: unknown): void;
