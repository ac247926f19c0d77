-- One id per database, written once: a hot standby holds the same row, so a
-- server can tell that a standby it was given is a copy of its primary
-- (TIDINGS_REPLICA_URLS) without any privilege beyond reading this table.
CREATE TABLE IF NOT EXISTS tidings_instance (
    singleton BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton),
    id        TEXT    NOT NULL
);
INSERT INTO tidings_instance (id) VALUES (md5(random()::text || clock_timestamp()::text)) ON CONFLICT DO NOTHING;
