-- The rate_limit window of each subscription (deliveries per second of
-- commit time over the last minute, as JSON [[second, count], ...]),
-- committed with the delivered count, so a restarted or new engine goes on
-- with the same window.
ALTER TABLE tidings_subscription_counts ADD COLUMN rate_window TEXT NOT NULL DEFAULT '[]';
