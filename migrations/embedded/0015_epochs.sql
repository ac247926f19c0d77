-- Epochs of the log (crates/server/src/store/epoch.rs): on the embedded
-- store a new epoch begins only by an operator's `tidings epoch new` after
-- restoring a backup of the data directory. Epoch 0 begins at 0: a log that
-- never lost history keeps its ids.
CREATE TABLE IF NOT EXISTS tidings_epochs (
    epoch      INTEGER PRIMARY KEY,
    fork       INTEGER NOT NULL,
    base       INTEGER NOT NULL,
    reason     TEXT    NOT NULL,
    started_ms INTEGER NOT NULL
);
INSERT OR IGNORE INTO tidings_epochs (epoch, fork, base, reason, started_ms)
VALUES (0, 0, 0, 'initial', CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER));
ALTER TABLE tidings_head ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
