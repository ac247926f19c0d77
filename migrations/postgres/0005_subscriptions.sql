-- Content-addressed entities (hash -> canonical JSON): every entity a tree
-- write stores, and the capability chains subscriptions keep (pinned), so
-- the subscription engine can resolve any hash a change event names even
-- after the path has moved on (include_payload, deliver-token expiry).
-- Retention drops unpinned entities older than the retained history that
-- no path holds any more.
CREATE TABLE IF NOT EXISTS tidings_content (
    hash      TEXT    PRIMARY KEY,
    body      TEXT    NOT NULL,
    stored_ms BIGINT  NOT NULL,
    pinned    BOOLEAN NOT NULL
);

-- The subscription engine's cursor: every tree change up to it has been
-- turned into notifications, committed in the same transaction as them.
-- It starts at the current head: no subscription existed before.
CREATE TABLE IF NOT EXISTS tidings_engine (
    name   TEXT   PRIMARY KEY,
    cursor BIGINT NOT NULL
);
INSERT INTO tidings_engine (name, cursor)
SELECT 'subscriptions', last_id FROM tidings_head
ON CONFLICT (name) DO NOTHING;

-- Notifications delivered per subscription (for max_events), committed with
-- the notifications themselves.
CREATE TABLE IF NOT EXISTS tidings_subscription_counts (
    subscription_id TEXT   PRIMARY KEY,
    delivered       BIGINT NOT NULL
);
