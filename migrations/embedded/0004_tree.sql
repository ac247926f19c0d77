-- The entity tree: one row per path, the entity as its canonical JSON, its
-- hash, and the event that last changed it. Every change also appends a
-- tree.created / tree.updated / tree.deleted event in the same transaction.
CREATE TABLE IF NOT EXISTS tree_entities (
    path          TEXT   PRIMARY KEY,
    entity        TEXT   NOT NULL,
    hash          TEXT   NOT NULL,
    changed_event BIGINT NOT NULL
);
