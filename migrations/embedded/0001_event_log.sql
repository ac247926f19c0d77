-- The event log of the embedded store. SQLite has one writer at a time, so
-- ids allocated inside the write transaction are gap-free and commit-ordered.
CREATE TABLE IF NOT EXISTS tidings_head (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    last_id   INTEGER NOT NULL
);
INSERT OR IGNORE INTO tidings_head (singleton, last_id) VALUES (1, 0);

CREATE TABLE IF NOT EXISTS events (
    id          INTEGER PRIMARY KEY,
    event_type  TEXT    NOT NULL,
    body        TEXT    NOT NULL,
    recorded_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS events_recorded_at ON events (recorded_at);
