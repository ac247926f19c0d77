-- PostgreSQL only: tidings.publish(...), the SQL outbox an application
-- publishes from inside its own transaction. The embedded store has no SQL
-- callers of its own; this entry keeps both stores' schema histories
-- numbered alike.
SELECT 1;
