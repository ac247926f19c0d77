-- One id per database, written once (the PostgreSQL store compares it with
-- its standbys'; kept here too so both stores share one schema history).
CREATE TABLE IF NOT EXISTS tidings_instance (
    singleton INTEGER PRIMARY KEY DEFAULT 1 CHECK (singleton = 1),
    id        TEXT    NOT NULL
);
INSERT OR IGNORE INTO tidings_instance (id) VALUES (lower(hex(randomblob(16))));
