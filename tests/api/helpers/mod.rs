//! The test harness: a real server on a random loopback port, on a fresh
//! PostgreSQL database or a fresh embedded data directory per test; and,
//! one file per concern, the helpers more than one test file uses:
//! `tokens`, `device` (a WebSocket device), `federation` (peers, signed
//! EXECUTEs, server processes), `mirrors`, `epochs` (backups, promotions).

pub(crate) mod device;
pub(crate) mod epochs;
pub(crate) mod federation;
pub(crate) mod mirrors;
pub(crate) mod proxy;
pub(crate) mod tokens;

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tidings_client::sse::{SseEvent, SseReader};
use tidings_server::app::Application;
use tidings_server::config::Settings;
use tidings_server::store::Store;
use tokio_util::sync::CancellationToken;

/// Which store a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    Postgres,
    Embedded,
}

/// Runs a test body once per store: `both_stores!(name, ...)` turns each
/// `async fn name(backend: Backend)` into `name::postgres` and `name::embedded`.
#[macro_export]
macro_rules! both_stores {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name($crate::helpers::Backend::Postgres).await;
                $crate::helpers::drop_databases().await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn embedded() { super::$name($crate::helpers::Backend::Embedded).await }
        }
    )*};
}

pub(crate) fn admin_url() -> String {
    std::env::var("TIDINGS_TEST_DATABASE_URL")
        .expect("TIDINGS_TEST_DATABASE_URL is not set: run the suite with scripts/test, which starts PostgreSQL")
}

/// Creates a fresh database and returns its URL and name.
pub(crate) async fn fresh_database() -> (String, String) {
    fresh_database_on(&admin_url()).await
}

thread_local! {
    /// The databases made on this thread, with their cluster's URL: a test
    /// body's own (libtest runs each test on a thread of its own, and a
    /// tokio test's body on it).
    static MADE: std::cell::RefCell<Vec<(String, String)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Creates a fresh database on the cluster of `admin` (a URL).
pub(crate) async fn fresh_database_on(admin: &str) -> (String, String) {
    let admin = admin.to_owned();
    let (client, conn) = tokio_postgres::connect(&admin, tokio_postgres::NoTls).await.expect("connecting to the test cluster");
    tokio::spawn(conn);
    let name = format!("t_{}", rand::random::<u64>());
    client.batch_execute(&format!("CREATE DATABASE {name}")).await.expect("creating a test database");
    MADE.with(|made| made.borrow_mut().push((admin.clone(), name.clone())));
    let url = match admin.rsplit_once('/') {
        Some((base, _)) => format!("{base}/{name}"),
        None => panic!("unexpected admin URL"),
    };
    (url, name)
}

/// Drops the databases this test's body made, once it passed (a failed
/// test keeps them to look at): each takes 7 MB or more, and the suite
/// makes hundreds. Best effort: a cluster the test stopped is skipped.
pub(crate) async fn drop_databases() {
    for (admin, name) in MADE.with(|made| std::mem::take(&mut *made.borrow_mut())) {
        let _ = tokio::time::timeout(Duration::from_secs(10), async {
            let (client, conn) = tokio_postgres::connect(&admin, tokio_postgres::NoTls).await?;
            tokio::spawn(conn);
            client.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await
        })
        .await;
    }
}

/// Settings for a test server: the defaults (never the ambient `TIDINGS_*`
/// variables), loopback port 0, short timeouts.
pub(crate) fn test_settings() -> Settings {
    let mut s = Settings::defaults();
    s.http.listen = "127.0.0.1:0".parse().unwrap();
    s.database_url = None;
    s.data_dir = std::env::temp_dir().join(format!("tidings-test-{}", rand::random::<u64>()));
    s.publish.registry = concat!(env!("CARGO_MANIFEST_DIR"), "/registry").into();
    s.publish.registry_mode = tidings_server::registry::RegistryMode::Warn;
    s.lifecycle.shutdown_timeout = Duration::from_secs(3);
    s
}

pub(crate) struct TestApp {
    settings: Settings,
    pub(crate) base: String,
    pub(crate) http: reqwest::Client,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) shutdown: CancellationToken,
    pub(crate) db_name: Option<String>,
    pub(crate) db_url: Option<String>,
    handle: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    dir: Option<tempfile::TempDir>,
}

pub(crate) async fn spawn_app(backend: Backend) -> TestApp {
    spawn_app_with(backend, |_| {}).await
}

pub(crate) async fn spawn_app_with(backend: Backend, configure: impl FnOnce(&mut Settings)) -> TestApp {
    match backend {
        Backend::Postgres => spawn_app_on(&admin_url(), configure).await,
        Backend::Embedded => spawn_app_at(None, configure).await,
    }
}

/// A PostgreSQL server on a fresh database of the cluster `admin` (a URL)
/// names.
pub(crate) async fn spawn_app_on(admin: &str, configure: impl FnOnce(&mut Settings)) -> TestApp {
    spawn_app_at(Some(fresh_database_on(admin).await), configure).await
}

/// A server on the database `db` (URL and name), or the embedded store.
async fn spawn_app_at(db: Option<(String, String)>, configure: impl FnOnce(&mut Settings)) -> TestApp {
    let mut settings = test_settings();
    // A fresh data directory for each server: the embedded store lives there,
    // and the server key on both stores.
    let dir = tempfile::tempdir().unwrap();
    settings.data_dir = dir.path().to_path_buf();
    settings.database_url = db.as_ref().map(|(url, _)| url.clone());
    configure(&mut settings);
    start(settings, Some(dir), db).await
}

/// Logs of the servers under test go to the test's captured output (shown
/// for failing tests); `TIDINGS_LOG` sets the level (default `warn`).
fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TIDINGS_LOG").unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
}

/// Starts a server on prepared settings.
pub(crate) async fn start(settings: Settings, dir: Option<tempfile::TempDir>, db: Option<(String, String)>) -> TestApp {
    init_logs();
    let app = Application::build(settings.clone()).await.expect("building the app");
    let base = format!("http://{}", app.local_addr());
    let store = app.store();
    let shutdown = app.shutdown_token();
    let handle = tokio::spawn(app.run_until_stopped());
    TestApp {
        settings,
        base,
        http: reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap(),
        store,
        shutdown,
        db_url: db.as_ref().map(|d| d.0.clone()),
        db_name: db.map(|d| d.1),
        handle: Some(handle),
        dir,
    }
}

impl Drop for TestApp {
    /// Servers share the test process: each stops when its test ends.
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl TestApp {
    /// Graceful stop (what SIGTERM does), then a new server on the same
    /// store, as after a restart.
    pub(crate) async fn restart(mut self) -> TestApp {
        self.shutdown.cancel();
        if let Some(handle) = self.handle.take() {
            handle.await.expect("the server task").expect("a clean stop");
        }
        let (settings, dir) = (self.settings.clone(), self.dir.take());
        let db = self.db_url.clone().zip(self.db_name.clone());
        drop(self);
        start(settings, dir, db).await
    }

    /// Graceful stop, waiting until the server has finished.
    pub(crate) async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(handle) = self.handle.take() {
            handle.await.expect("the server task").expect("a clean stop");
        }
    }

    /// The server's data directory.
    pub(crate) fn data_dir(&self) -> std::path::PathBuf {
        self.settings.data_dir.clone()
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// Publishes one event body; returns the status and JSON answer.
    pub(crate) async fn post_events(&self, body: &Value) -> (u16, Value) {
        let r = self.http.post(self.url("/v1/events")).json(body).send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Publishes a raw body with a content type.
    pub(crate) async fn post_raw(&self, body: impl Into<reqwest::Body>) -> (u16, Value) {
        let r = self.http.post(self.url("/v1/events")).header("content-type", "application/json").body(body).send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Publishes one event of `event_type` and returns its id.
    pub(crate) async fn publish(&self, event_type: &str, payload: Value) -> i64 {
        let (status, body) = self.post_events(&json!({"event_type": event_type, "payload": payload})).await;
        assert_eq!(status, 201, "publish failed: {body}");
        body["event_ids"][0].as_i64().unwrap()
    }

    /// Opens `/v1/stream` with a query string and optional Last-Event-ID.
    pub(crate) async fn stream(&self, query: &str, last_event_id: Option<i64>) -> Stream {
        let url = self.url(&format!("/v1/stream{query}"));
        Stream { reader: tidings_client::sse::connect(&self.http, &url, last_event_id).await.expect("opening the stream") }
    }

    pub(crate) async fn head(&self) -> i64 {
        self.store.head().await.unwrap()
    }

    /// A connection to this test's database (PostgreSQL only).
    pub(crate) async fn db(&self) -> tokio_postgres::Client {
        let (client, conn) =
            tokio_postgres::connect(self.db_url.as_deref().expect("a PostgreSQL test"), tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        client
    }

    /// Streaming clients the broker holds (from `/health/deep`).
    pub(crate) async fn clients(&self) -> i64 {
        let v: Value = self.http.get(self.url("/health/deep")).send().await.unwrap().json().await.unwrap();
        v["events"]["in_flight_subscriptions"].as_i64().unwrap()
    }

    /// `/health/deep` as JSON, with its status.
    pub(crate) async fn deep(&self) -> (u16, Value) {
        let r = self.http.get(self.url("/health/deep")).send().await.unwrap();
        (r.status().as_u16(), r.json().await.unwrap())
    }

    /// `/health/deep` as a caller with `bearer` (or none) sees it.
    pub(crate) async fn deep_as(&self, bearer: Option<String>) -> Value {
        let mut request = self.http.get(self.url("/health/deep"));
        if let Some(bearer) = bearer {
            request = request.bearer_auth(bearer);
        }
        request.send().await.unwrap().json().await.unwrap()
    }

    /// Value of a metric line (exact name with labels) in `/metrics`.
    pub(crate) async fn metric(&self, series: &str) -> f64 {
        let text = self.http.get(self.url("/metrics")).send().await.unwrap().text().await.unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
            .unwrap_or(0.0)
    }
}

pub(crate) struct Stream {
    reader: SseReader<tidings_client::sse::BodyStream>,
}

impl Stream {
    /// Reads an already opened `/v1/stream` response.
    pub(crate) fn from_response(response: reqwest::Response) -> Self {
        Stream { reader: SseReader::new(Box::pin(response.bytes_stream())) }
    }

    /// The next event, failing the test after 10 s of silence.
    pub(crate) async fn next(&mut self) -> SseEvent {
        tokio::time::timeout(Duration::from_secs(10), self.reader.next_event())
            .await
            .expect("timed out waiting for an event")
            .expect("the stream ended")
    }

    /// The next event or `None` if the stream ends.
    pub(crate) async fn next_or_end(&mut self) -> Option<SseEvent> {
        tokio::time::timeout(Duration::from_secs(10), self.reader.next_event()).await.expect("timed out waiting for an event")
    }

    /// The last `retry:` the server sent, in ms.
    pub(crate) fn retry_ms(&self) -> Option<u64> {
        self.reader.parser().retry_ms
    }

    /// The next `n` event ids (unnamed events only).
    pub(crate) async fn ids(&mut self, n: usize) -> Vec<i64> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let e = self.next().await;
            if e.event.is_none() {
                out.push(e.id.expect("events carry an id").parse().unwrap());
            }
        }
        out
    }
}

/// A tidings server running as its own OS process (the real binary).
pub(crate) struct Process {
    pub(crate) child: tokio::process::Child,
    pub(crate) base: String,
    /// Everything it wrote to stderr, read as it comes (see [`Process::log`]).
    log: std::sync::Arc<std::sync::Mutex<String>>,
    reader: Option<tokio::task::JoinHandle<()>>,
}

impl Process {
    /// Everything it has logged so far.
    pub(crate) fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Value of a metric line (exact name with labels) in its `/metrics`
    /// (over HTTPS without checking the certificate, for a TLS server).
    pub(crate) async fn metric(&self, series: &str) -> f64 {
        let http = reqwest::Client::builder().danger_accept_invalid_certs(true).build().unwrap();
        let text = http.get(format!("{}/metrics", self.base)).send().await.unwrap().text().await.unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
            .unwrap_or(0.0)
    }

    /// Stops it (SIGKILL) and returns everything it logged.
    pub(crate) async fn kill_and_log(mut self) -> String {
        let _ = self.child.kill().await;
        if let Some(reader) = self.reader.take() {
            let _ = reader.await;
        }
        self.log.lock().unwrap().clone()
    }
}

/// Waits until `check` holds, checking it every `every` (a bare yield when
/// zero); the test fails with `what` once `within` has passed.
pub(crate) async fn wait_until<F: std::future::Future<Output = bool>>(
    what: &str,
    within: Duration,
    every: Duration,
    mut check: impl FnMut() -> F,
) {
    let deadline = std::time::Instant::now() + within;
    while !check().await {
        assert!(std::time::Instant::now() < deadline, "waited {within:?} for {what}");
        if every.is_zero() {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(every).await;
        }
    }
}

/// Runs `step` until it breaks, handing each step the state the one before
/// it continued with (a cursor, what was read so far), and returns what it
/// broke with; the test fails with `what(&state)` once `within` has passed.
/// The deadline is checked between steps, so each step bounds itself (a
/// long poll's `wait_ms`, a client timeout) and paces itself (a sleep, a
/// yield). The state goes by value, so a step is a plain closure returning
/// an `async move` block, and a spawned task may wait too.
pub(crate) async fn gather<S, T, F: std::future::Future<Output = ControlFlow<T, S>>>(
    within: Duration,
    mut state: S,
    what: impl Fn(&S) -> String,
    mut step: impl FnMut(S) -> F,
) -> T {
    let deadline = std::time::Instant::now() + within;
    loop {
        match step(state).await {
            ControlFlow::Break(done) => return done,
            ControlFlow::Continue(next) => state = next,
        }
        assert!(std::time::Instant::now() < deadline, "waited {within:?}: {}", what(&state));
    }
}

/// [`wait_until`] with 30 s, checking every 100 ms.
pub(crate) async fn eventually<F: std::future::Future<Output = bool>>(what: &str, check: impl FnMut() -> F) {
    wait_until(what, Duration::from_secs(30), Duration::from_millis(100), check).await
}

/// A loopback port for a server a test starts as a process. It is taken
/// below the kernel's ephemeral range (`ip_local_port_range`), where no
/// outgoing connection of any test is given a local port, so nothing can
/// take it between this check and the server's bind; within this binary no
/// port is handed out twice; and it is free now (a bind succeeds).
pub(crate) fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> = std::sync::Mutex::new(std::collections::BTreeSet::new());
    let ephemeral_from = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (low, high) = (ephemeral_from.saturating_sub(12_000).max(10_000), ephemeral_from);
    assert!(low < high, "no ports below the ephemeral range ({ephemeral_from})");
    for _ in 0..10_000 {
        let port = rand::random_range(low..high);
        if GIVEN.lock().unwrap().insert(port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {low}..{high}")
}

/// The environment that puts a `tidings` process on `backend`: a data
/// directory (the embedded store, and the server key on both stores) and,
/// on PostgreSQL, a fresh database. The directory lives as long as the
/// returned guard; restarting with the same environment finds the same
/// store.
pub(crate) async fn process_store(backend: Backend) -> (Vec<(&'static str, String)>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut envs = vec![("TIDINGS_DATA_DIR", dir.path().display().to_string())];
    if backend == Backend::Postgres {
        envs.push(("DATABASE_URL", fresh_database().await.0));
    }
    (envs, dir)
}

/// The `tidings` binary with a clean environment plus `envs`, on `port`.
pub(crate) fn process_command(envs: &[(&str, String)], port: u16) -> tokio::process::Command {
    // scripts/chaos runs a copy, so a rebuild meanwhile changes nothing.
    let binary = std::env::var_os("TIDINGS_TEST_BINARY").unwrap_or_else(|| env!("CARGO_BIN_EXE_tidings").into());
    let mut cmd = tokio::process::Command::new(binary);
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("TIDINGS_LISTEN", format!("127.0.0.1:{port}"))
        .env("TIDINGS_REGISTRY", concat!(env!("CARGO_MANIFEST_DIR"), "/registry"))
        // SIGTERM stops a test's server at once unless a test asks for a
        // drain (the rolling-restart tests set their own).
        .env("TIDINGS_DRAIN_DELAY", "0s")
        .env("TIDINGS_DRAIN", "0s")
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// Starts the binary and waits (bounded) until it answers `/health`.
pub(crate) async fn spawn_process(envs: &[(&str, String)]) -> Process {
    spawn_process_at(envs, free_port()).await
}

/// [`spawn_process`] on a given port (a restart that clients find again).
pub(crate) async fn spawn_process_at(envs: &[(&str, String)], port: u16) -> Process {
    let mut child = process_command(envs, port).spawn().expect("starting tidings");
    // Its log is read as it comes (a full pipe would stall the server),
    // kept (the last 4 MiB) and shown with TIDINGS_TEST_SERVER_LOG=1.
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = child.stderr.take().map(|stderr| {
        let (show, log) = (std::env::var_os("TIDINGS_TEST_SERVER_LOG").is_some(), log.clone());
        tokio::spawn(async move {
            use tokio::io::AsyncBufReadExt as _;
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if show {
                    eprintln!("[{port}] {line}");
                }
                let mut log = log.lock().unwrap();
                if log.len() > 4 << 20 {
                    log.clear();
                }
                log.push_str(&line);
                log.push('\n');
            }
        })
    });
    if envs.iter().any(|(k, _)| *k == "TIDINGS_TLS_CERT_FILE") {
        // HTTPS: ready once `/health` answers over TLS (the tests' own
        // HTTP client speaks plain HTTP only; curl is the TLS client).
        let base = format!("https://127.0.0.1:{port}");
        for _ in 0..200 {
            let out = tokio::process::Command::new("curl")
                .args(["-sk", "-o", "/dev/null", "-w", "%{http_code}"])
                .arg(format!("{base}/health"))
                .output()
                .await;
            if out.is_ok_and(|o| o.stdout == b"200") {
                return Process { child, base, log, reader };
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("tidings did not become ready over TLS");
    }
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    for _ in 0..200 {
        if let Ok(r) = http.get(format!("{base}/health")).send().await
            && r.status() == 200
        {
            return Process { child, base, log, reader };
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("tidings did not become ready");
}

/// A fresh Ed25519 key, its `system/identity` entity and the entity's hash.
pub(crate) fn ed25519_identity() -> (ed25519_dalek::SigningKey, Value, String) {
    use base64::Engine as _;
    let key = ed25519_dalek::SigningKey::from_bytes(&rand::random::<[u8; 32]>());
    let public = base64::engine::general_purpose::STANDARD.encode(key.verifying_key().as_bytes());
    let entity = json!({"type": "system/identity", "data": {"algorithm": "ed25519", "public_key": public}});
    let hash = tidings_protocol::tree::capability::hash_of(&entity).unwrap();
    (key, entity, hash)
}

/// A TCP proxy to `upstream` that loses the answers of its first `drop`
/// connections: it forwards the request, reads the server's first byte (the
/// answer is on its way, so the request was served) and closes both sides
/// without passing anything back. Later connections are forwarded whole.
pub(crate) async fn answer_dropping_proxy(upstream: std::net::SocketAddr, drop: usize) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut served = 0;
        while let Ok((mut client, _)) = listener.accept().await {
            let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await else { return };
            served += 1;
            if served > drop {
                tokio::spawn(async move {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                });
                continue;
            }
            tokio::spawn(async move {
                let (mut request, mut answer) = (vec![0u8; 64 * 1024], [0u8; 1]);
                loop {
                    tokio::select! {
                        n = client.read(&mut request) => match n {
                            Ok(n) if n > 0 => if server.write_all(&request[..n]).await.is_err() { return },
                            _ => return,
                        },
                        // The answer began: lose it, and the connection.
                        _ = server.read(&mut answer) => return,
                    }
                }
            });
        }
    });
    addr
}

/// Ends every LISTEN session of tidings on database `name` (seen from
/// `client`, a connection to the same cluster); how many there were.
pub(crate) async fn terminate_listeners(client: &tokio_postgres::Client, name: &str) -> i64 {
    client
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = $1 AND application_name = 'tidings-listener'",
            &[&name],
        )
        .await
        .unwrap()
        .get(0)
}

/// Replaces what lies between the line `begin` starts and the line `end`
/// starts in the file at `path` (from the repository's root) with
/// `generated`, when `TIDINGS_BLESS` is set; otherwise fails when they
/// differ: what the code generates (a table in the book, the clients'
/// protocol constants) cannot drift from it.
pub(crate) fn generated_in(path: &str, begin: &str, end: &str, generated: &str) {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    let text = std::fs::read_to_string(&file).unwrap();
    let (head, rest) = text.split_once(begin).unwrap_or_else(|| panic!("{path} has {begin:?}"));
    let (marker_line, rest) = rest.split_once('\n').unwrap();
    let (committed, tail) = rest.split_once(end).unwrap_or_else(|| panic!("{path} has {end:?}"));
    if std::env::var_os("TIDINGS_BLESS").is_some() {
        std::fs::write(&file, format!("{head}{begin}{marker_line}\n{generated}{end}{tail}")).unwrap();
        return;
    }
    assert_eq!(committed, generated, "{path} differs from what the code generates: run TIDINGS_BLESS=1 with this test");
}

/// Runs `command` (a program that starts children of its own: `node
/// --test` runs each file in a child, a browser script starts Chromium),
/// waiting at most `limit`. A run that does not end in time is stopped
/// whole, its descendants too ([`kill_tree`]), and `None` is returned:
/// killing the program alone left a child behind, spinning for good.
pub(crate) async fn output_within(command: &mut tokio::process::Command, limit: Duration) -> Option<std::process::Output> {
    let child = command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the program starts");
    let tree = Tree(child.id().expect("the program runs"));
    let mut run = std::pin::pin!(child.wait_with_output());
    let Ok(out) = tokio::time::timeout(limit, &mut run).await else {
        // Stopped now, while the program still holds its children (the
        // run's own drop would kill the program alone, orphaning them).
        drop(tree);
        return None;
    };
    tree.disarm();
    Some(out.expect("the program's output is read"))
}

/// A child this test started, and everything it started in turn, killed
/// when this is dropped: forget it once the child has been waited for, and
/// drop it before the child's `Child` (which waits for it) otherwise.
pub(crate) struct Tree(pub(crate) u32);

impl Tree {
    /// The child was waited for: its number may be another process's from
    /// now on, and nothing is killed.
    pub(crate) fn disarm(self) {
        std::mem::forget(self);
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        kill_tree(self.0);
    }
}

/// Kills `pid` (a child this test started and has not waited for, so
/// everything under it is this test's own; checked) and its descendants, found by
/// their parents in `/proc`, whatever their process group (Playwright
/// starts Chromium in a session of its own); the children stay in the
/// test's group, so a run stopped from the terminal stops them as before.
pub(crate) fn kill_tree(pid: u32) {
    let mut parents = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(child) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        // The parent is the second field after the command's `)`.
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let parent = stat.rsplit(')').next().and_then(|rest| rest.split_whitespace().nth(1)).and_then(|p| p.parse::<u32>().ok());
        if let Some(parent) = parent {
            parents.push((child, parent));
        }
    }
    // A number this test's process no longer has as its child (waited for
    // already) may be another process's: nothing is killed then.
    if !parents.contains(&(pid, std::process::id())) {
        return;
    }
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(parents.iter().filter(|(_, p)| *p == parent).map(|(c, _)| *c));
        i += 1;
    }
    let pids: Vec<String> = tree.iter().map(u32::to_string).collect();
    let _ = std::process::Command::new("kill").arg("-KILL").args(&pids).status();
}

/// A program that does not end in time is stopped with its children: a
/// shell that started a child of its own and waits, here.
#[tokio::test]
async fn a_program_that_does_not_end_in_time_is_stopped_with_its_children() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("child.pid");
    let script = format!("sleep 300 & echo $! > {}; wait", pid_file.display());
    let out = output_within(tokio::process::Command::new("sh").args(["-c", &script]), Duration::from_secs(2)).await;
    assert!(out.is_none(), "the shell waits for its child");
    let child = std::fs::read_to_string(&pid_file).unwrap().trim().to_owned();
    // Killed, it is a zombie until init reaps it, then gone.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let state = std::fs::read_to_string(format!("/proc/{child}/stat")).ok();
        if state.as_deref().is_none_or(|s| s.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z'))) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the shell's child was left running: {state:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
