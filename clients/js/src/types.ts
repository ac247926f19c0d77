/**
 * The shapes the server sends and takes: envelopes, filters, new events and
 * the notices of a stream (docs/ref-http.md). `test/envelope.ts` checks the
 * envelope against the schema the protocol crate generates.
 *
 * @module
 */

/** Who may see an event. */
export type Visibility = "public" | "reviewer_only" | "admin";

/** The agent an event is attributed to. */
export interface Agent {
  id: string;
  /** Free-form (`ai_persona`, `human`); optional, as the server takes it. */
  kind?: string;
}

/** A typed relation from an event to something it concerns. */
export interface Link {
  rel: string;
  ref: string;
}

/** An event as the server delivers it (envelope version 1). */
export interface Envelope<Payload = Record<string, unknown>> {
  envelope_version: number;
  /** Assigned by the server: increasing, the resume point of every transport. */
  event_id: number;
  event_type: string;
  ref?: string | null;
  agent?: Agent | null;
  session_id?: string | null;
  occurred_at: string;
  payload: Payload;
  links: Link[];
  visibility: Visibility;
  /** The W3C trace context the event was published in, if any: continue the trace from it. */
  traceparent?: string;
  tracestate?: string;
}

/** What a client asks for; fields are AND-combined, values within one OR-combined. */
export interface Filter {
  /** Globs over dotted event types: `*` is one segment, `**` one or more. */
  types?: string[];
  agents?: string[];
  /** Matches an event's `ref` or any of its `links[].ref`. */
  targets?: string[];
  /** A JsonLogic rule over the payload, evaluated by the server. */
  payload?: unknown;
}

/** An event to publish: the server assigns the id (and the time, by default). */
export interface NewEvent {
  event_type: string;
  ref?: string;
  agent?: Agent;
  session_id?: string;
  payload?: Record<string, unknown>;
  links?: Link[];
  visibility?: Visibility;
  occurred_at?: string;
}

/** A resume point the server could not serve whole: resume from `available_from`. */
export interface ReplayGap {
  requested: number;
  available_from: number;
  head: number;
  /**
   * Why: `pruned` (history before `available_from` was deleted),
   * `replay_limit` (further back than one resume may replay), `beyond_head`
   * (the point is past the head), `history_lost` (the server's store lost
   * the history after `fork` in a failover or a restore: events seen after
   * the fork are gone, and every event after the fork follows).
   */
  reason?: "pruned" | "replay_limit" | "beyond_head" | "history_lost";
  /** With `history_lost`: the last id that survived. */
  fork?: number;
}

/** The server closed a stream that fell behind; the client resumes from `last_event_id`. */
export interface DroppedNotice {
  reason: "queue_full" | "no_progress";
  last_event_id: number | null;
  queue: number;
}

/** The stream's token expired (`system.token_expired`): it ends, and resumes under a fresh token. */
export interface TokenExpiredNotice {
  last_event_id: number | null;
}

/** Once per stream, the payload rule went over its budget on an event, which did not match. */
export interface FilterBudgetExceeded {
  budget: number;
}

/** Where a stream or connection is. */
export type State = "connecting" | "open" | "closed";
