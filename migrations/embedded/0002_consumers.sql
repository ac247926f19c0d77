-- Durable consumers (docs/polling.md): a stored filter and a cursor that only
-- confirmations move. Times are Unix milliseconds.
CREATE TABLE IF NOT EXISTS consumer_subscriptions (
    consumer_id      TEXT    PRIMARY KEY,
    filter_json      TEXT,
    cursor           INTEGER NOT NULL,
    created_ms       INTEGER NOT NULL,
    last_activity_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS consumer_subscriptions_activity ON consumer_subscriptions (last_activity_ms);

CREATE TABLE IF NOT EXISTS consumer_expired (
    consumer_id TEXT    PRIMARY KEY,
    expired_ms  INTEGER NOT NULL
);
