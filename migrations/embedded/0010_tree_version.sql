-- What a listing below a prefix is current at (entries, and the sum of the
-- ids of the changes that wrote them) read from this index alone, without
-- a table row per entry: subscribes read it for the subscriptions'
-- directory instead of listing every subscription.
CREATE INDEX IF NOT EXISTS tree_entities_path_changed ON tree_entities (path, changed_event);
