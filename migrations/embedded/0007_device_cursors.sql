-- WebSocket device cursors: per (owner identity, device_id), moved only by
-- stream.ack (monotonic, clamped to the head).
CREATE TABLE IF NOT EXISTS tidings_device_cursors (
    owner      TEXT    NOT NULL,
    device_id  TEXT    NOT NULL,
    cursor     INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    PRIMARY KEY (owner, device_id)
);
