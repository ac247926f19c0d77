-- Publishes that carried an Idempotency-Key: per publisher (scope) and key,
-- the SHA-256 of the request body and the event ids it was answered with
-- (a JSON array), written in the same transaction as those events. A key
-- older than TIDINGS_IDEMPOTENCY_WINDOW counts as absent and is pruned.
CREATE TABLE IF NOT EXISTS tidings_idempotency (
    scope      TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    body_hash  BLOB    NOT NULL,
    event_ids  TEXT    NOT NULL,
    created_ms INTEGER NOT NULL,
    PRIMARY KEY (scope, key)
);
CREATE INDEX IF NOT EXISTS tidings_idempotency_created ON tidings_idempotency (created_ms);
