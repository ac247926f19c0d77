//! The composition root: the only place that picks a concrete store. Builds
//! every subsystem from [`Settings`], binds the listener, and runs until the
//! shutdown token is cancelled (zero-to-production's `Application`).

#![allow(clippy::disallowed_types, reason = "the application joins the transports' router to the listener")]
#![allow(clippy::disallowed_methods, reason = "the application starts and stops the process's long-lived tasks")]

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::auth::{AuthMode, Verifier};
use crate::broker::{Broker, BrokerSettings};
use crate::config::AuthSetting;
use crate::config::Settings;
use crate::http::{AppState, router};

use crate::federation::engine::EngineSettings;
use crate::registry::Registry;
use crate::server::{ServeOptions, serve};
use crate::service::{ServiceParts, Services};
use crate::store::Store;
use crate::store::embedded::EmbeddedStore;
use crate::store::postgres::{PostgresOptions, PostgresStore};

/// A built, bound server, ready to run.
#[derive(Debug)]
pub struct Application {
    core: Services,
    listener: TcpListener,
    addr: SocketAddr,
    router: axum::Router,
    broker: Broker,
    store: Arc<dyn Store>,
    subscriptions: Arc<crate::federation::Subscriptions>,
    options: ServeOptions,
    /// What history's retention task keeps.
    history: crate::config::HistorySettings,
    consumer_ttl: std::time::Duration,
    background: Background,
    shutdown: CancellationToken,
    /// Cancelled when a drain begins.
    draining: CancellationToken,
    /// `TIDINGS_DRAIN_DELAY`: how long a drain keeps serving before it
    /// ends streams.
    drain_delay: std::time::Duration,
    /// `TIDINGS_DRAIN`: the window streams are ended over.
    drain_window: std::time::Duration,
}

/// The pace of the background tasks.
#[derive(Debug)]
struct Background {
    health_probe: std::time::Duration,
    engine: EngineSettings,
}

/// Opens the store the settings name: PostgreSQL with `DATABASE_URL`, the
/// embedded store in the data directory otherwise.
pub async fn open_store(settings: &Settings) -> anyhow::Result<Arc<dyn Store>> {
    match &settings.database_url {
        Some(_) => tracing::info!(store = "postgres", "tidings stores events in PostgreSQL (DATABASE_URL)"),
        None => {
            tracing::info!(store = "embedded", dir = %settings.data_dir.display(), "tidings stores events in the embedded store (set DATABASE_URL for PostgreSQL)")
        }
    }
    Ok(match &settings.database_url {
        Some(url) => Arc::new(PostgresStore::connect(url, PostgresOptions::from_settings(&settings.postgres)).await?),
        None if settings.postgres.delivery == crate::config::Delivery::Replicated => {
            anyhow::bail!(
                "TIDINGS_DELIVERY=replicated needs PostgreSQL with a synchronous standby (set DATABASE_URL); the embedded store has no replication"
            )
        }
        None => Arc::new(EmbeddedStore::open(&settings.data_dir).await?),
    })
}

/// Decides how requests are authenticated. With a key, tokens are required
/// (unless `TIDINGS_AUTH=off`); without one, authentication is off, which is
/// only allowed on a loopback address: anyone who can reach the port could
/// otherwise publish as anyone and read everything.
pub fn resolve_auth(settings: &Settings) -> anyhow::Result<AuthMode> {
    let verifier = match (&settings.auth.jwt_hs256_secret, &settings.auth.jwt_public_key_file) {
        (Some(_), Some(_)) => anyhow::bail!("set only one of TIDINGS_JWT_HS256_SECRET and TIDINGS_JWT_PUBLIC_KEY_FILE"),
        (Some(secret), None) => Some(Verifier::hs256(secret.expose().as_bytes())?),
        (None, Some(path)) => Some(Verifier::public_key_file(path)?),
        (None, None) => None,
    }
    .map(|v| v.expect(settings.auth.jwt_audience.as_deref(), settings.auth.jwt_issuer.as_deref()));
    match (settings.auth.auth, verifier) {
        (Some(AuthSetting::Jwt), None) => {
            anyhow::bail!("TIDINGS_AUTH=jwt needs a key: set TIDINGS_JWT_HS256_SECRET or TIDINGS_JWT_PUBLIC_KEY_FILE")
        }
        (Some(AuthSetting::Jwt) | None, Some(verifier)) => Ok(AuthMode::Jwt(Arc::new(verifier))),
        (Some(AuthSetting::Off), _) | (None, None) => {
            if !settings.http.listen.ip().is_loopback() {
                anyhow::bail!(
                    "refusing to listen on {} with authentication off: anyone who reaches this address could publish as any agent and \
                     read every event. Configure TIDINGS_JWT_HS256_SECRET or TIDINGS_JWT_PUBLIC_KEY_FILE, or listen on a loopback \
                     address (127.0.0.1 or ::1) for local development",
                    settings.http.listen
                );
            }
            tracing::warn!(
                listen = %settings.http.listen,
                "authentication is off: every local caller may publish and read everything (development only; configure a JWT key for anything else)"
            );
            Ok(AuthMode::Off)
        }
    }
}

/// Writes the peers of `TIDINGS_PEERS` into the tree, as the server itself
/// (an admin), where the tree does not already hold exactly that entity (a
/// restart writes nothing new). The setting wins over an admin's edit of a
/// peer it names; peers it does not name are left alone.
async fn seed_peers(core: &Services) -> anyhow::Result<()> {
    let mut server = crate::auth::Identity::local();
    server.sub = core.identity().hash().to_owned();
    for peer in &core.settings().federation.peers.0 {
        let path = peer.path();
        let (canonical, hash) = peer.entity().canonical();
        if core.store().tree_get(&path).await?.is_some_and(|current| current.hash == hash) {
            continue;
        }
        let chain = tidings_protocol::tree::generate_id();
        crate::service::tree::put(core, &server, &path, crate::store::Condition::Always, canonical.as_bytes(), chain, None)
            .await
            .with_context(|| format!("writing peer {} from TIDINGS_PEERS", peer.hash))?;
        tracing::info!(peer = peer.hash, endpoint = peer.endpoint, "peer seeded");
    }
    Ok(())
}

/// Reads the TLS certificate and key again on every `SIGHUP` (a renewed
/// certificate is put in place, then the server told): new connections get
/// it, open ones keep theirs. A pair that does not load is logged and the
/// one in use stays.
async fn reload_on_hangup(certificates: Arc<crate::server::tls::Certificates>, shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangups = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %crate::report::chain(&e), "no SIGHUP handler: the TLS certificate is read only at start-up");
            return;
        }
    };
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            got = hangups.recv() => if got.is_none() { return },
        }
        match certificates.reload() {
            Ok(()) => {
                crate::metrics::tls_reloaded(true);
                tracing::info!("TLS certificate reloaded");
            }
            Err(e) => {
                crate::metrics::tls_reloaded(false);
                tracing::warn!(error = %crate::report::chain(&e), "the TLS certificate did not reload; the one in use stays");
            }
        }
    }
}

/// Time allowed for proving a subscriber's relay endpoint (`GET
/// /v1/identity` there) during a subscribe.
const PROVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

impl Application {
    /// Builds every subsystem and binds the listen address.
    pub async fn build(mut settings: Settings) -> anyhow::Result<Self> {
        let auth = resolve_auth(&settings)?;
        crate::http::cors(&settings.http.cors_origins)?;
        let metrics = crate::metrics::install();
        let store = open_store(&settings).await?;
        let registry = Arc::new(
            Registry::load(&settings.publish.registry, settings.publish.registry_mode).context("loading the event-type registry")?,
        );
        crate::metrics::register_types(registry.docs().map(|d| d.name.as_str()));
        tracing::info!(
            source = registry.source(),
            types = registry.len(),
            mode = ?settings.publish.registry_mode,
            "event-type registry in force (TIDINGS_REGISTRY names a directory of <type>.json files to bring your own)"
        );
        let head = store.head().await.context("reading the head of the event log")?;
        tracing::info!(store = store.kind().as_str(), head, registered_types = registry.len(), mode = ?settings.publish.registry_mode, "store opened");

        let broker = Broker::new(store.clone(), head, BrokerSettings::from_settings(&settings.streams));
        let shutdown = CancellationToken::new();
        let draining = CancellationToken::new();
        let (drain_delay, drain_window) = (settings.lifecycle.drain_delay, settings.lifecycle.drain);
        let listener = TcpListener::bind(settings.http.listen).await.with_context(|| format!("binding {}", settings.http.listen))?;
        let addr = listener.local_addr()?;
        // What peers are told to reach this server at.
        if settings.http.public_url.is_empty() {
            let scheme = if settings.http.tls_cert_file.is_some() { "https" } else { "http" };
            settings.http.public_url = format!("{scheme}://{addr}");
        }
        settings.http.public_url = settings.http.public_url.trim_end_matches('/').to_owned();
        tidings_protocol::peer::check_endpoint(&settings.http.public_url).map_err(|e| anyhow::anyhow!("TIDINGS_PUBLIC_URL: {e}"))?;
        let options = ServeOptions {
            header_timeout: settings.http.header_timeout,
            shutdown_timeout: settings.lifecycle.shutdown_timeout,
            direct: crate::http::streams,
            // The broker's own bound for a stuck live client: dropped after
            // the slow-client timeout, closed by force after the grace.
            write_timeout: settings.streams.slow_client_timeout + settings.streams.eviction_grace,
            refuse: crate::http::head_refusal,
            tls: match (&settings.http.tls_cert_file, &settings.http.tls_key_file) {
                (Some(cert), Some(key)) => {
                    let (config, certificates) = crate::server::tls::load(cert, key).context("loading the TLS certificate")?;
                    tokio::spawn(reload_on_hangup(certificates, shutdown.clone()));
                    Some(config)
                }
                _ => None,
            },
        };
        let history = settings.history.clone();
        let consumer_ttl = settings.poll.consumer_ttl;
        let background = Background {
            health_probe: settings.lifecycle.health_probe_interval,
            engine: crate::federation::engine::EngineSettings::from_settings(&settings.federation, &settings.http.public_url),
        };
        let server = Arc::new(crate::keyfile::load_or_create(settings.server_key_file.as_deref(), &settings.data_dir)?);
        tracing::info!(identity = server.hash(), "server identity");
        // Proving a subscriber's relay endpoint is a quick question, not a
        // delivery: its own bound, under the same allow list.
        let outbound = tidings_outbound::Outbound::new(Arc::new(settings.federation.peer_allow.clone()), PROVE_TIMEOUT);
        let subscriptions = Arc::new(crate::federation::Subscriptions::new(store.clone(), server.clone(), &settings.federation, outbound));
        let core = Services::new(ServiceParts {
            settings,
            store: store.clone(),
            broker: broker.clone(),
            registry,
            identity: server,
            subscriptions: subscriptions.clone(),
            entity_rules: vec![tidings_protocol::peer::check, crate::federation::mirror::check],
            shutdown: shutdown.clone(),
            draining: draining.clone(),
        });
        seed_peers(&core).await?;
        // What tidings.publish (SQL) checks names against: this registry.
        let names = core.registry().docs().flat_map(|d| std::iter::once(d.name.clone()).chain(d.renamed_from.iter().cloned())).collect();
        let strict = core.registry().mode() == crate::registry::RegistryMode::Strict;
        core.store()
            .registry_sync(names, strict, core.settings().publish.max_payload)
            .await
            .context("writing the registry for tidings.publish")?;
        let state = AppState::new(core.clone(), auth, metrics);
        Ok(Self {
            core,
            listener,
            addr,
            router: router(state),
            broker,
            store,
            subscriptions,
            options,
            history,
            consumer_ttl,
            background,
            shutdown,
            draining,
            drain_delay,
            drain_window,
        })
    }

    /// What ends this server gracefully, for a rolling restart
    /// ([`Drainer::drain`]); keep it before [`Self::run_until_stopped`].
    pub fn drainer(&self) -> Drainer {
        Drainer {
            draining: self.draining.clone(),
            shutdown: self.shutdown.clone(),
            broker: self.broker.clone(),
            delay: self.drain_delay,
            window: self.drain_window,
        }
    }

    /// The bound address (the port is real even when `:0` was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The store this server appends to.
    pub fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    /// Cancelling this token starts a graceful shutdown (at once: a
    /// rolling restart drains first, [`Self::drainer`]).
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Serves until the shutdown token is cancelled and every connection has
    /// finished (or the shutdown deadline closed it).
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let background = CancellationToken::new();
        self.store.hand_off_to(self.broker.hand_off());
        let listener_task = self.store.start_wakeups(self.broker.waker(), background.clone());
        let broker_task = tokio::spawn(self.broker.clone().run(self.shutdown.clone(), background.clone()));
        let retention_task = tokio::spawn(crate::store::run_retention(self.store.clone(), self.history, background.clone()));
        let expiry_task = tokio::spawn(crate::service::poll::run_expiry(self.store.clone(), self.consumer_ttl, background.clone()));
        let probe_task = tokio::spawn(crate::store::run_health_probe(self.store.clone(), self.background.health_probe, background.clone()));
        let engine = crate::federation::supervisor::Supervisor::new(
            self.store.clone(),
            self.subscriptions.clone(),
            self.broker.follow(),
            self.background.engine.clone(),
        );
        let engine_task = tokio::spawn(engine.run(background.clone()));
        let freshness_task = tokio::spawn(crate::service::freshness::run(self.core.clone(), background.clone()));
        // The mover takes the application's own handle: once serving ends,
        // nothing here holds the core longer than its tasks (the group
        // committers release the store when the last handle goes, and an
        // embedded store's directory lock with it).
        let outbox_task = tokio::spawn(crate::service::outbox::run_mover(self.core, background.clone()));
        tracing::info!(addr = %self.addr, "tidings is serving");
        serve(self.listener, self.router, self.options, self.shutdown).await;
        background.cancel();
        let _ = tokio::join!(listener_task, broker_task, retention_task, expiry_task, probe_task, engine_task, outbox_task, freshness_task);
        tracing::info!("tidings stopped");
        Ok(())
    }
}

/// A rolling restart's way out (DESIGN "Scaling out"): `/health/ready`
/// answers `503` at once; connections are still served for
/// `TIDINGS_DRAIN_DELAY`, long enough for load balancers to notice; then the
/// open streams are ended spread over `TIDINGS_DRAIN` (each with a jittered
/// `retry:`, or WebSocket close 1001), so their reconnections reach the
/// other processes spread over the window; then the graceful shutdown
/// begins: no new connections, in-flight requests (publishes) finish.
#[derive(Debug, Clone)]
pub struct Drainer {
    draining: CancellationToken,
    shutdown: CancellationToken,
    broker: Broker,
    delay: std::time::Duration,
    window: std::time::Duration,
}

impl Drainer {
    /// Drains, then starts the shutdown; returns when the shutdown began.
    /// Cancelling the shutdown token meanwhile (a second signal) cuts it
    /// short.
    pub async fn drain(self) {
        self.draining.cancel();
        tracing::info!(delay = ?self.delay, window = ?self.window, "draining: /health/ready answers 503");
        tokio::select! {
            _ = self.shutdown.cancelled() => return,
            _ = tokio::time::sleep(self.delay) => {}
        }
        tracing::info!(streams = self.broker.client_count(), "draining: ending open streams over the drain window");
        tokio::select! {
            _ = self.shutdown.cancelled() => return,
            _ = self.broker.drain(self.window) => {}
        }
        self.shutdown.cancel();
    }
}
