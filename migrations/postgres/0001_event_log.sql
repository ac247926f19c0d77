-- The event log. Ids are allocated under the row lock of tidings_head inside
-- the appending transaction, so they are gap-free and become visible in
-- commit order (a plain sequence gives neither).
CREATE TABLE IF NOT EXISTS tidings_head (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    last_id   bigint  NOT NULL
);
INSERT INTO tidings_head (singleton, last_id) VALUES (true, 0) ON CONFLICT DO NOTHING;

-- body is the envelope JSON without envelope_version and event_id, stored as
-- text so that frames are built from the exact bytes (cast to jsonb to query).
CREATE TABLE IF NOT EXISTS events (
    id          bigint      PRIMARY KEY,
    event_type  text        NOT NULL,
    body        text        NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS events_recorded_at ON events (recorded_at);
