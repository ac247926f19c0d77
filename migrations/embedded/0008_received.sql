-- Deliveries received from peers: per (sending server, subscription) the
-- highest sender sequence appended, moved in the transaction that appends
-- the notification, so a retried delivery is recognised and stores nothing.
CREATE TABLE IF NOT EXISTS tidings_received (
    source TEXT    NOT NULL,
    stream TEXT    NOT NULL,
    seq    INTEGER NOT NULL,
    PRIMARY KEY (source, stream)
);
