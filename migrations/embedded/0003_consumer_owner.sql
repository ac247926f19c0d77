-- A durable consumer belongs to the identity that created it ('local' when
-- authentication is off); other identities get 403 unless admin.
ALTER TABLE consumer_subscriptions ADD COLUMN owner TEXT NOT NULL DEFAULT 'local';
