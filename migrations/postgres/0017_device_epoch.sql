-- The log's epoch at a WebSocket device's last hello or ack
-- (store/epoch.rs): a stored cursor that stands at or past the fork of an
-- epoch begun since may have been shown events the store lost, and the
-- device's next hello is told (stream.gap, history_lost).
ALTER TABLE tidings_device_cursors ADD COLUMN IF NOT EXISTS epoch integer NOT NULL DEFAULT 0;
