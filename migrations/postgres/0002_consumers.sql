-- Durable consumers (docs/polling.md): a stored filter and a cursor that only
-- confirmations move. Times are Unix milliseconds, like the embedded store.
CREATE TABLE IF NOT EXISTS consumer_subscriptions (
    consumer_id      text   PRIMARY KEY,
    filter_json      text,
    cursor           bigint NOT NULL,
    created_ms       bigint NOT NULL,
    last_activity_ms bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS consumer_subscriptions_activity ON consumer_subscriptions (last_activity_ms);

-- Consumers collected for silence, remembered so that resuming one without
-- `since` answers 410 cursor_expired instead of silently starting over.
CREATE TABLE IF NOT EXISTS consumer_expired (
    consumer_id text   PRIMARY KEY,
    expired_ms  bigint NOT NULL
);
