-- Consumer ids are scoped by owner: a consumer is stored under
-- '<owner>/<id>' (an id has no '/'), so two owners' 'nightly' are two
-- consumers and nobody learns whether another owner's id exists. Existing
-- consumers move under their owner, cursor and all. Markers of consumers
-- collected before this have no owner to move under: such a consumer,
-- polled again without `since`, starts afresh at the head.
UPDATE consumer_subscriptions SET consumer_id = owner || '/' || consumer_id WHERE strpos(consumer_id, '/') = 0;
CREATE INDEX IF NOT EXISTS consumer_subscriptions_owner ON consumer_subscriptions (owner);
