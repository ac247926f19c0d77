//! The one LISTEN connection per process (`application_name=tidings-listener`).
//! It owns its connection and only wakes the broker; a notification is a
//! hint, and every (re)connect wakes it too, so a lost NOTIFY loses nothing.

use super::*;

/// How often the LISTEN connection is probed, so a silently cut network is
/// noticed even when no notification is due. A constant: it bounds how long
/// a lost LISTEN goes unnoticed, and nothing is lost meanwhile (the broker
/// also reads after every commit of its own process and on each reconnect).
const LISTENER_PROBE: Duration = Duration::from_secs(5);

pub(super) async fn listen_loop(
    mut config: tokio_postgres::Config,
    status: Arc<ListenerStatus>,
    epochs: Arc<crate::store::epoch::EpochCache>,
    wake: Arc<Notify>,
    cancel: CancellationToken,
) {
    config.application_name("tidings-listener");
    // Reconnecting to a database that is down, jittered so processes do
    // not reconnect at once.
    let mut backoff = crate::pacing::LISTEN;
    let mut first = true;
    loop {
        let result = tokio::select! {
            _ = cancel.cancelled() => return,
            r = listen_once(&config, &status, &epochs, &wake, &cancel, &mut backoff) => r,
        };
        if cancel.is_cancelled() {
            return;
        }
        status.state.store(2, Ordering::Relaxed);
        if !first || result.is_err() {
            status.reconnects.fetch_add(1, Ordering::Relaxed);
            crate::metrics::listener_reconnected();
        }
        first = false;
        match result {
            Ok(()) => tracing::warn!("LISTEN connection closed; reconnecting"),
            Err(e) => {
                tracing::warn!(error = %crate::report::chain(e.as_ref()), backoff_ms = backoff.peek().as_millis() as u64, "LISTEN connection lost; reconnecting")
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(backoff.next_delay()) => {}
        }
    }
}

#[expect(clippy::disallowed_methods, reason = "the LISTEN connection is driven on a task that ends with the session")]
async fn listen_once(
    config: &tokio_postgres::Config,
    status: &ListenerStatus,
    epochs: &crate::store::epoch::EpochCache,
    wake: &Notify,
    cancel: &CancellationToken,
    backoff: &mut tidings_protocol::retry::Backoff,
) -> anyhow::Result<()> {
    let (mut client, mut connection) = config.connect(NoTls).await.context("connecting the LISTEN session")?;
    // A commit's head, or `None` for a wake-up of the outbox.
    let (tx, mut rx) = mpsc::unbounded_channel::<Option<i64>>();
    // The connection future must be polled for the client to make progress;
    // it also yields the notifications.
    let driver = tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    // The payload is the head after the commit (0 if it
                    // does not parse: a wake-up all the same).
                    let head = (n.channel() != OUTBOX_CHANNEL).then(|| n.payload().parse().unwrap_or(0));
                    if tx.send(head).is_err() {
                        break;
                    }
                }
                Ok(_) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    });
    let guard = DriverGuard(Some(driver));
    // A (re)connect may have reached another database than before (a
    // promoted standby, a restore): the epoch is settled (before LISTEN, so
    // the session shows LISTEN as what it is for) before the broker
    // reads anything, and a head below what this process saw committed is a
    // lost suffix too.
    let seen = status.seen.load(Ordering::Acquire);
    super::epoch::settle(&mut client, epochs, super::epoch::Settle::Check { seen }).await.context("settling the event log's epoch")?;
    let listen = format!("LISTEN {CHANNEL}; LISTEN {OUTBOX_CHANNEL}");
    client.batch_execute(&listen).await.context("LISTEN")?;
    // Notifications may have been missed while not listening: the next
    // tail read asks the primary, whatever the heads notified say.
    status.unsure.store(true, Ordering::Release);
    status.state.store(1, Ordering::Relaxed);
    status.heard_ms.store(chrono::Utc::now().timestamp_millis(), Ordering::Relaxed);
    backoff.reset();
    tracing::info!("LISTEN connection established");
    // Anything committed while we were not listening is read now (and
    // moved, for the outbox).
    wake.notify_one();
    status.outbox.notify_one();
    let mut probe = tokio::time::interval(LISTENER_PROBE);
    probe.tick().await;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            n = rx.recv() => {
                let Some(n) = n else { break };
                status.heard_ms.store(chrono::Utc::now().timestamp_millis(), Ordering::Relaxed);
                match n {
                    Some(head) => {
                        status.notified.fetch_max(head, Ordering::AcqRel);
                        wake.notify_one();
                    }
                    None => status.outbox.notify_one(),
                }
            }
            _ = probe.tick() => {
                // The probe re-issues LISTEN (a no-op on a channel already
                // listened to), so pg_stat_activity keeps showing what this
                // session is for.
                tokio::time::timeout(LISTENER_PROBE, client.batch_execute(&listen))
                    .await
                    .context("LISTEN probe timed out")?
                    .context("LISTEN probe")?;
            }
        }
    }
    // The driver ended (it dropped the sender): why, from the database.
    match guard.finish().await {
        Some(Err(e)) => Err(anyhow::Error::new(e).context("LISTEN connection ended")),
        _ => anyhow::bail!("LISTEN connection ended"),
    }
}

/// Aborts the connection driver when the listener gives up on it.
struct DriverGuard(Option<tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>>);

impl DriverGuard {
    /// The driver's end, once it has ended.
    async fn finish(mut self) -> Option<Result<(), tokio_postgres::Error>> {
        self.0.take()?.await.ok()
    }
}

impl Drop for DriverGuard {
    fn drop(&mut self) {
        if let Some(driver) = &self.0 {
            driver.abort();
        }
    }
}
