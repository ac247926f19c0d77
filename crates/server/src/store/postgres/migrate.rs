//! Migrations of the PostgreSQL schema: versioned, each once, in a
//! transaction, serialised across processes by an advisory lock.

use super::*;

/// Migrations, in order. Each runs once, inside a transaction, recorded in
/// `tidings_migrations`; the whole run is serialised by an advisory lock so
/// several processes starting together do not race.
const MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "event_log", include_str!("../../../../../migrations/postgres/0001_event_log.sql")),
    (2, "consumers", include_str!("../../../../../migrations/postgres/0002_consumers.sql")),
    (3, "consumer_owner", include_str!("../../../../../migrations/postgres/0003_consumer_owner.sql")),
    (4, "tree", include_str!("../../../../../migrations/postgres/0004_tree.sql")),
    (5, "subscriptions", include_str!("../../../../../migrations/postgres/0005_subscriptions.sql")),
    (6, "rate_window", include_str!("../../../../../migrations/postgres/0006_rate_window.sql")),
    (7, "device_cursors", include_str!("../../../../../migrations/postgres/0007_device_cursors.sql")),
    (8, "received", include_str!("../../../../../migrations/postgres/0008_received.sql")),
    (9, "consumer_scope", include_str!("../../../../../migrations/postgres/0009_consumer_scope.sql")),
    (10, "tree_version", include_str!("../../../../../migrations/postgres/0010_tree_version.sql")),
    (11, "peer_marks", include_str!("../../../../../migrations/postgres/0011_peer_marks.sql")),
    (12, "instance", include_str!("../../../../../migrations/postgres/0012_instance.sql")),
    (13, "idempotency", include_str!("../../../../../migrations/postgres/0013_idempotency.sql")),
    (14, "sql_publish", include_str!("../../../../../migrations/postgres/0014_sql_publish.sql")),
    (15, "epochs", include_str!("../../../../../migrations/postgres/0015_epochs.sql")),
    (16, "consumer_epoch", include_str!("../../../../../migrations/postgres/0016_consumer_epoch.sql")),
    (17, "device_epoch", include_str!("../../../../../migrations/postgres/0017_device_epoch.sql")),
    (18, "outbox_payload_limit", include_str!("../../../../../migrations/postgres/0018_outbox_payload_limit.sql")),
    (19, "publish_trace", include_str!("../../../../../migrations/postgres/0019_publish_trace.sql")),
];

impl PostgresStore {
    /// Applies pending migrations; idempotent.
    pub async fn migrate(&self) -> anyhow::Result<()> {
        let mut client = self.pool.get().await.context("connecting to PostgreSQL")?;
        client.batch_execute("SELECT pg_advisory_lock(7324001)").await?;
        let result = async {
            client
                .batch_execute(
                    "CREATE TABLE IF NOT EXISTS tidings_migrations (
                        version integer PRIMARY KEY, name text NOT NULL,
                        applied_at timestamptz NOT NULL DEFAULT now())",
                )
                .await?;
            for (version, name, sql) in MIGRATIONS {
                let tx = client.transaction().await?;
                let done = tx.query_opt("SELECT 1 FROM tidings_migrations WHERE version = $1", &[version]).await?;
                if done.is_none() {
                    tracing::info!(version, name, "applying migration");
                    tx.batch_execute(sql).await.with_context(|| format!("migration {version} {name}"))?;
                    tx.execute("INSERT INTO tidings_migrations (version, name) VALUES ($1, $2)", &[version, name]).await?;
                }
                tx.commit().await?;
            }
            anyhow::Ok(())
        }
        .await;
        client.batch_execute("SELECT pg_advisory_unlock(7324001)").await?;
        result
    }
}
