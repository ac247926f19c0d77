-- What a mirror has taken from its peer, kept across restarts: the highest
-- log id of the peer's changes it applied or read (a monotonic max, not
-- clamped to this server's head: it counts the peer's log).
CREATE TABLE IF NOT EXISTS tidings_peer_marks (
    owner      TEXT   NOT NULL,
    name       TEXT   NOT NULL,
    mark       INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    PRIMARY KEY (owner, name)
);
