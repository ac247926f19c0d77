-- The log's epoch at a durable consumer's last read (store/epoch.rs): a
-- cursor that stands at or past the fork of an epoch begun since may have
-- been shown events the store lost, and its first read in the new epoch
-- carries the history_lost gap.
ALTER TABLE consumer_subscriptions ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
