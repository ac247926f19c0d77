/**
 * {@link createClient}: the server's address and token given once, and every
 * capability of the client bound to them.
 *
 * @module
 */

import type { ClientOptions } from "./http.js";
import { connect, type Connection, type ConnectOptions } from "./device.js";
import { Consumer, poll, type PollPage, type PollRequest } from "./poll.js";
import { publish, type Published, type PublishOptions } from "./publish.js";
import { stream, type Stream, type StreamOptions } from "./stream.js";
import type { Filter, NewEvent } from "./types.js";

/** A client bound to one server: what {@link createClient} returns. */
export interface Client {
  /** A resuming stream ({@link stream}): with `onEvent`, or iterated with `for await`. */
  stream(filter?: Filter, options?: Omit<StreamOptions, keyof ClientOptions>): Stream;
  /** One poll ({@link poll}). */
  poll(request?: PollRequest): Promise<PollPage>;
  /** A durable consumer ({@link Consumer}). */
  consumer(id: string, filter?: Filter): Consumer;
  /** A device connection ({@link connect}). */
  connect(options: Omit<ConnectOptions, keyof ClientOptions>): Connection;
  /** Publishes one event or a batch ({@link publish}). */
  publish(events: NewEvent | NewEvent[], options?: Omit<PublishOptions, keyof ClientOptions>): Promise<Published>;
}

/**
 * A client for the server at `options.url` (in a page, the page's origin by
 * default) with `options.token` (a fixed token, or a function asked before
 * every request and reconnection):
 *
 * ```ts
 * const client = createClient({ url: "https://tidings.example", token: () => session.token() });
 * for await (const event of client.stream({ types: ["order.*"] })) show(event);
 * ```
 */
export function createClient(options: ClientOptions = {}): Client {
  const bound: ClientOptions = { ...options };
  return {
    stream: (filter = {}, more = {}) => stream(filter, { ...more, ...bound }),
    poll: (request = {}) => poll(request, bound),
    consumer: (id, filter = {}) => new Consumer(id, filter, bound),
    connect: (more) => connect({ ...more, ...bound }),
    publish: (events, more = {}) => publish(events, { ...more, ...bound }),
  };
}
