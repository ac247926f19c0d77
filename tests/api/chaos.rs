//! The fault campaign (docs/guarantees.md): a
//! seeded, randomized run of real tidings processes under faults, judged
//! by the independent checker (`checker`).
//!
//! On PostgreSQL: two processes on a multi-host `DATABASE_URL` over a
//! primary and its asynchronous standby, each host behind a fault proxy
//! (`lacodda-tear`: cut, black-hole, outage, throttle). On the embedded
//! store: one process and its data directory. Publishers retry with
//! idempotency keys until answered `201`; every process has an SSE client
//! that resumes with `Last-Event-ID`, a polling client with `since`, a
//! durable consumer, an MCP agent, and two WebSocket devices that say hello
//! with their last seq and page `sync.delta` before they go live (one of
//! them acknowledges, so the server keeps its cursor).
//! Faults, drawn from the seed: `kill -9`, SIGTERM, SIGSTOP/SIGCONT of a
//! process; PostgreSQL stopped at once (`-m immediate`) and restarted; the
//! LISTEN sessions terminated; the network to the primary cut, black-holed,
//! taken away or slowed; and, once, the primary killed and the standby
//! promoted. Then the faults stop, a last event is published, and the
//! checker reads every client's history against the final log: no id with
//! two bodies, nothing seen that is not in the log unless announced lost,
//! nothing skipped, nothing stored twice, and (but for what an
//! asynchronous promotion loses) every `201` in the log.
//!
//! `TIDINGS_CHAOS_SEED` replays a run; `TIDINGS_CHAOS_SECONDS` sets its
//! length (the suite's default keeps both stores under two minutes);
//! `TIDINGS_CHAOS_REPORT` names a file the figures are appended to, one
//! JSON line a store (`scripts/chaos` runs the long campaign).

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lacodda_tear::{Cut, Tear};
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use serde_json::{Value, json};

use crate::chaos_peers;
use crate::checker::{self, Follower, Seen};
use crate::helpers::epochs::host_of;
use crate::helpers::{free_port, process_command};
use crate::readers;

/// One tidings process the campaign starts, kills and starts again on
/// the same port.
struct Server {
    port: u16,
    envs: Vec<(&'static str, String)>,
    child: Option<tokio::process::Child>,
}

impl Server {
    fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Starts it, again and again until it answers `/health` (its database
    /// may be down or cut off: it refuses to start then), for at most 90 s.
    async fn start(&mut self) {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(1)).build().unwrap();
        let deadline = Instant::now() + Duration::from_secs(90);
        while Instant::now() < deadline {
            let envs: Vec<(&str, String)> = self.envs.iter().map(|(k, v)| (*k, v.clone())).collect();
            let mut cmd = process_command(&envs, self.port);
            cmd.stderr(std::process::Stdio::null());
            let mut child = cmd.spawn().expect("starting tidings");
            for _ in 0..100 {
                if let Ok(r) = http.get(format!("{}/health", self.base())).send().await
                    && r.status() == 200
                {
                    self.child = Some(child);
                    return;
                }
                if child.try_wait().unwrap().is_some() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let _ = child.kill().await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("tidings on port {} did not start within 90 s", self.port);
    }

    fn pid(&self) -> String {
        self.child.as_ref().and_then(|c| c.id()).expect("a running process").to_string()
    }

    async fn signal(&self, signal: &str) {
        let status = tokio::process::Command::new("kill").args([signal, &self.pid()]).status().await.unwrap();
        assert!(status.success(), "kill {signal}");
    }

    async fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// SIGTERM, and the exit waited for (SIGKILL after 30 s).
    async fn terminate(&mut self) {
        self.signal("-TERM").await;
        if let Some(mut child) = self.child.take()
            && tokio::time::timeout(Duration::from_secs(30), child.wait()).await.is_err()
        {
            let _ = child.kill().await;
        }
    }
}

/// What a campaign did and found (docs/guarantees.md's figures).
#[derive(Debug, Default)]
struct Figures {
    store: &'static str,
    seed: u64,
    seconds: u64,
    faults: BTreeMap<&'static str, u64>,
    listen_sessions_terminated: u64,
    publishes_acknowledged: u64,
    publish_attempts_refused: u64,
    events_in_final_log: usize,
    events_checked: usize,
    losses_announced: usize,
    events_seen_then_lost: usize,
    tree_writes: u64,
    inbox_notifications_checked: usize,
    inbox_losses_announced: usize,
    acknowledged_lost_in_promotion: usize,
}

impl Figures {
    fn to_json(&self) -> Value {
        json!({
            "store": self.store,
            "seed": self.seed,
            "seconds": self.seconds,
            "faults": self.faults,
            "listen_sessions_terminated": self.listen_sessions_terminated,
            "publishes_acknowledged": self.publishes_acknowledged,
            "publish_attempts_refused": self.publish_attempts_refused,
            "events_in_final_log": self.events_in_final_log,
            "events_checked": self.events_checked,
            "losses_announced": self.losses_announced,
            "events_seen_then_lost": self.events_seen_then_lost,
            "acknowledged_lost_in_promotion": self.acknowledged_lost_in_promotion,
            "tree_writes": self.tree_writes,
            "inbox_notifications_checked": self.inbox_notifications_checked,
            "inbox_losses_announced": self.inbox_losses_announced,
        })
    }
}

/// The run's seed and length.
fn run_settings() -> (u64, u64) {
    let seed = std::env::var("TIDINGS_CHAOS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    let seconds = std::env::var("TIDINGS_CHAOS_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(35);
    (seed, seconds)
}

/// Publishers: each sends `{"p": p, "n": n}` with the idempotency key
/// `p-n` to the servers in turn until one answers `201` (answers `503` and
/// connection failures are retried, with the same key), then the next.
fn publishers(bases: Arc<Vec<String>>, stop: Arc<AtomicBool>, refused: Arc<AtomicU64>) -> Vec<tokio::task::JoinHandle<Vec<(i64, Value)>>> {
    (0..2)
        .map(|p| {
            let (bases, stop, refused) = (bases.clone(), stop.clone(), refused.clone());
            tokio::spawn(async move {
                let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
                let mut acknowledged = Vec::new();
                let mut n = 0u64;
                'publishing: while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let payload = json!({"p": p, "n": n});
                    for attempt in 0u64.. {
                        let base = &bases[((n + attempt) % bases.len() as u64) as usize];
                        let sent = http
                            .post(format!("{base}/v1/events"))
                            .header("Idempotency-Key", format!("{p}-{n}"))
                            .json(&json!({"event_type": "comment.posted", "payload": payload}))
                            .send()
                            .await;
                        match sent {
                            Ok(r) if r.status() == 201 => {
                                let body: Value = r.json().await.unwrap_or(Value::Null);
                                if let Some(id) = body["event_ids"][0].as_i64() {
                                    acknowledged.push((id, payload.clone()));
                                }
                                break;
                            }
                            Ok(r) if r.status() != 503 => panic!("a publish answered {}", r.status()),
                            _ => {
                                refused.fetch_add(1, Ordering::Relaxed);
                                // Past the end of the run, an attempt left
                                // unanswered is left so: at most once in
                                // the log, and not acknowledged.
                                if stop.load(Ordering::Relaxed) && attempt > 40 {
                                    break 'publishing;
                                }
                                tokio::time::sleep(Duration::from_millis(25)).await;
                            }
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(15)).await;
                }
                acknowledged
            })
        })
        .collect()
}

/// The PostgreSQL hosts of a campaign, each behind its fault proxy.
struct Database {
    /// The admin URL and `pg_ctl` line of the primary and the standby.
    hosts: [(String, String); 2],
    tears: [Tear; 2],
    /// Which of `hosts` is the primary now.
    primary: usize,
    promoted: bool,
    name: String,
}

impl Database {
    async fn pg_ctl(&self, host: usize, args: &[&str]) {
        crate::helpers::epochs::pg_ctl_line(&self.hosts[host].1, args).await;
    }

    /// Terminates the LISTEN sessions of the campaign's database; how
    /// many it terminated.
    async fn terminate_listeners(&self) -> u64 {
        let url = self.hosts[self.primary].0.clone();
        let Ok((client, conn)) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await else { return 0 };
        tokio::spawn(conn);
        let terminated = client
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'tidings-listener' AND datname = $1",
                &[&self.name],
            )
            .await;
        terminated.map_or(0, |rows| rows.iter().filter(|r| r.get::<_, bool>(0)).count() as u64)
    }
}

/// Every fault kind, by name.
const PROCESS_FAULTS: &[&str] = &["kill9", "sigterm", "sigstop"];
const DATABASE_FAULTS: &[&str] = &["pg_restart", "listen_killed", "net_cut", "net_blackhole", "net_outage", "net_slow"];

/// Injects one fault of `kind` into a tidings process, lasting what the
/// seed says, and undoes it.
async fn process_fault(kind: &'static str, rng: &mut StdRng, servers: &Mutex<Vec<Server>>) {
    let pause = Duration::from_millis(rng.random_range(300..2500));
    let which = rng.random_range(0..servers.lock().unwrap().len());
    // The server is taken out while the fault holds it (clients use its
    // port only).
    let mut s = std::mem::replace(&mut servers.lock().unwrap()[which], Server { port: 0, envs: Vec::new(), child: None });
    // A process that exited by itself is a crash, not a fault of ours.
    if let Some(status) = s.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
        panic!("tidings on port {} exited by itself ({status}) before a {kind}", s.port);
    }
    match kind {
        "kill9" => {
            s.kill9().await;
            tokio::time::sleep(pause / 2).await;
            s.start().await;
        }
        "sigterm" => {
            s.terminate().await;
            s.start().await;
        }
        "sigstop" => {
            s.signal("-STOP").await;
            tokio::time::sleep(pause).await;
            s.signal("-CONT").await;
        }
        other => unreachable!("{other}"),
    }
    servers.lock().unwrap()[which] = s;
}

/// Injects one fault of `kind` into PostgreSQL or the network to it,
/// lasting what the seed says, and undoes it. How many sessions it
/// terminated (`listen_killed`).
async fn database_fault(kind: &'static str, rng: &mut StdRng, db: &mut Database) -> u64 {
    let pause = Duration::from_millis(rng.random_range(300..2500));
    let tear = &db.tears[db.primary];
    match kind {
        "pg_restart" => {
            db.pg_ctl(db.primary, &["-m", "immediate", "stop"]).await;
            tokio::time::sleep(pause).await;
            db.pg_ctl(db.primary, &["start"]).await;
        }
        "listen_killed" => return db.terminate_listeners().await,
        "net_cut" => tear.cut(Cut::Now),
        "net_blackhole" => {
            tear.stall();
            tokio::time::sleep(pause).await;
            tear.flow();
        }
        "net_outage" => {
            tear.offline();
            tokio::time::sleep(pause).await;
            tear.online();
        }
        "net_slow" => {
            tear.throttle(20_000);
            tokio::time::sleep(pause * 2).await;
            tear.unthrottle();
        }
        // The standby falls behind (stopped while publishes go on), the
        // primary dies, and the standby is promoted: the newest events are
        // lost, and whoever saw them is told.
        "promotion" => {
            let (old, new) = (db.primary, 1 - db.primary);
            db.pg_ctl(new, &["-m", "fast", "stop"]).await;
            tokio::time::sleep(pause).await;
            db.pg_ctl(old, &["-m", "immediate", "stop"]).await;
            db.pg_ctl(new, &["start"]).await;
            db.pg_ctl(new, &["promote"]).await;
            db.primary = new;
            db.promoted = true;
        }
        other => unreachable!("{other}"),
    }
    0
}

/// The faults of a run on two schedules of their own, so that they
/// overlap: tidings processes on one, PostgreSQL and its network (with
/// the promotion, once, between half and three quarters of the run) on
/// the other. Each schedule draws from its own generator seeded from the
/// run's. How many faults of each kind, and the sessions terminated.
async fn faults(seed: u64, seconds: u64, servers: &Mutex<Vec<Server>>, db: Option<&mut Database>) -> (BTreeMap<&'static str, u64>, u64) {
    let end = Instant::now() + Duration::from_secs(seconds);
    let processes = async {
        let (mut rng, mut counts) = (StdRng::seed_from_u64(seed), BTreeMap::new());
        while Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(rng.random_range(500..2000))).await;
            let kind = PROCESS_FAULTS[rng.random_range(0..PROCESS_FAULTS.len())];
            *counts.entry(kind).or_insert(0) += 1;
            process_fault(kind, &mut rng, servers).await;
        }
        counts
    };
    let database = async {
        let (mut counts, mut terminated) = (BTreeMap::new(), 0);
        let Some(db) = db else { return (counts, terminated) };
        let mut rng = StdRng::seed_from_u64(seed.rotate_left(32) ^ 0xdb);
        let promote_at = Instant::now() + Duration::from_millis(seconds * 1000 * rng.random_range(50..75) / 100);
        while Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(rng.random_range(500..2000))).await;
            let kind = if !db.promoted && Instant::now() >= promote_at {
                "promotion"
            } else {
                DATABASE_FAULTS[rng.random_range(0..DATABASE_FAULTS.len())]
            };
            *counts.entry(kind).or_insert(0) += 1;
            terminated += database_fault(kind, &mut rng, db).await;
        }
        (counts, terminated)
    };
    let (mut counts, (database, terminated)) = tokio::join!(processes, database);
    counts.extend(database);
    (counts, terminated)
}

/// One campaign on the given store; its figures, or the checker's finding.
async fn campaign(store: &'static str, seed: u64, seconds: u64) -> Figures {
    let mut figures = Figures { store, seed, seconds, ..Figures::default() };
    let data = tempfile::tempdir().unwrap();
    let mut db = None;
    let envs: Vec<(&'static str, String)> = if store == "postgres" {
        let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set: run the suite with scripts/test"));
        let primary = (var("TIDINGS_TEST_CHAOS_PRIMARY_URL"), var("TIDINGS_TEST_CHAOS_PRIMARY_PG_CTL"));
        let standby = (var("TIDINGS_TEST_CHAOS_STANDBY_URL"), var("TIDINGS_TEST_CHAOS_STANDBY_PG_CTL"));
        let (_, name) = crate::helpers::fresh_database_on(&primary.0).await;
        let tears = [
            Tear::start(host_of(&primary.0).parse().unwrap()).await.unwrap(),
            Tear::start(host_of(&standby.0).parse().unwrap()).await.unwrap(),
        ];
        let url = format!("postgres://postgres@{},{}/{name}?target_session_attrs=read-write", tears[0].addr(), tears[1].addr());
        db = Some(Database { hosts: [primary, standby], tears, primary: 0, promoted: false, name });
        // The processes share the data directory for its key, as a
        // deployment's processes share one identity.
        vec![("DATABASE_URL", url), ("TIDINGS_DB_TIMEOUT", "2s".into()), ("TIDINGS_DATA_DIR", data.path().display().to_string())]
    } else {
        vec![("TIDINGS_DATA_DIR", data.path().display().to_string())]
    };
    let count = if store == "postgres" { 2 } else { 1 };
    let mut started = Vec::new();
    for _ in 0..count {
        let mut s = Server { port: free_port(), envs: envs.clone(), child: None };
        s.start().await;
        started.push(s);
    }
    let bases: Arc<Vec<String>> = Arc::new(started.iter().map(Server::base).collect());
    let servers = Mutex::new(started);
    let (stop, refused) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let http = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    // A server that the processes notify of the tree's changes, and a
    // writer of the tree.
    let receiver = chaos_peers::Receiver::start(&http, &bases[0]).await;
    let writing = chaos_peers::writer(bases.clone(), stop.clone());
    let publishing = publishers(bases.clone(), stop.clone(), refused.clone());
    let followers: Vec<Follower> = bases.iter().map(|b| Follower::start_at(http.clone(), format!("{b}/v1/stream?since=0"))).collect();
    let until = Arc::new(AtomicI64::new(0));
    // Per process: a poller, a durable consumer, an MCP agent, a device
    // that keeps its own place and one whose place the server keeps (it
    // acknowledges), each named for the process it reads.
    let readers: Vec<(String, tokio::task::JoinHandle<Vec<Seen>>)> = bases
        .iter()
        .enumerate()
        .flat_map(|(i, b)| {
            [
                (format!("poll@{i}"), readers::poller(b.clone(), until.clone())),
                (format!("consumer@{i}"), readers::consumer(b.clone(), format!("chaos-{i}"), until.clone())),
                (format!("mcp@{i}"), readers::agent(b.clone(), format!("chaos-mcp-{i}"), until.clone())),
                (format!("ws@{i}"), readers::device(b.clone(), format!("chaos-{i}"), until.clone(), false)),
                (format!("ws-ack@{i}"), readers::device(b.clone(), format!("chaos-ack-{i}"), until.clone(), true)),
            ]
        })
        .collect();

    let (counts, terminated) = faults(seed, seconds, &servers, db.as_mut()).await;
    figures.faults = counts;
    figures.listen_sessions_terminated = terminated;

    // The end: publishers finish, one last event, every client reads to it.
    stop.store(true, Ordering::Relaxed);
    let mut acknowledged = Vec::new();
    for p in publishing {
        acknowledged.extend(p.await.unwrap());
    }
    figures.tree_writes = writing.await.unwrap();
    let last_write = chaos_peers::last_write(&http, &bases, seed).await;
    let last = json!({"last": seed});
    let last_id = crate::helpers::gather(
        Duration::from_secs(60),
        (),
        |_| "the last event to be published".into(),
        |()| {
            let (http, base, last) = (http.clone(), bases[0].clone(), last.clone());
            async move {
                let r = http
                    .post(format!("{base}/v1/events"))
                    .header("Idempotency-Key", "last")
                    .json(&json!({"event_type": "comment.posted", "payload": last}))
                    .send()
                    .await;
                match r {
                    Ok(r) if r.status() == 201 => ControlFlow::Break(r.json::<Value>().await.unwrap()["event_ids"][0].as_i64().unwrap()),
                    _ => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        ControlFlow::Continue(())
                    }
                }
            }
        },
    )
    .await;
    acknowledged.push((last_id, last));
    until.store(last_id, Ordering::Release);
    for f in &followers {
        f.wait_for("every SSE client to read to the last event", Duration::from_secs(60), last_id).await;
    }
    let mut clients = Vec::new();
    for (i, f) in followers.into_iter().enumerate() {
        clients.push((format!("sse@{i}"), f.stop().await));
    }
    for (name, reader) in readers {
        let seen = tokio::time::timeout(Duration::from_secs(60), reader).await;
        clients
            .push((name.clone(), seen.unwrap_or_else(|_| panic!("seed {seed} ({store}): {name} did not read to the last event")).unwrap()));
    }
    // The peer's inbox, while the senders still run (their courier
    // delivers the last notifications).
    let inbox = receiver.read_to(last_write, &http, &bases).await;
    // The final log, as each process serves it, and (on PostgreSQL) as
    // the table holds it: they must be one.
    let log = checker::final_log_at(&http, &bases[0]).await;
    for base in &bases[1..] {
        assert!(checker::final_log_at(&http, base).await == log, "seed {seed} ({store}): {base} serves another final log");
    }
    if let Some(db) = &db {
        let url = format!("{}/{}", db.hosts[db.primary].0.rsplit_once('/').unwrap().0, db.name);
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        let rows = client.query("SELECT id, body FROM events ORDER BY id", &[]).await.unwrap();
        let table: Vec<(i64, Value)> = rows
            .iter()
            .map(|r| (r.get::<_, i64>(0), serde_json::from_str::<Value>(r.get::<_, &str>(1)).unwrap()["payload"].clone()))
            .collect();
        assert!(table == log, "seed {seed} ({store}): the events table is not the log the processes serve");
    }
    // The epoch the promotion began: what it may have lost lies between
    // its fork and its base.
    let deep: Value = http.get(format!("{}/health/deep", bases[0])).send().await.unwrap().json().await.unwrap();
    let (fork, base) = (deep["epoch"]["fork"].as_i64().unwrap_or(0), deep["epoch"]["base"].as_i64().unwrap_or(0));
    for s in servers.lock().unwrap().iter_mut() {
        if let Some(c) = s.child.as_mut() {
            let _ = c.start_kill();
        }
    }

    let verdict = checker::check(&log, &clients).unwrap_or_else(|e| {
        // What every client saw, the final log and the epoch, for whoever
        // replays the seed.
        let path = format!("{}/target/chaos-failure-{seed}-{store}.json", env!("CARGO_MANIFEST_DIR"));
        let seen: BTreeMap<&str, String> = clients.iter().map(|(name, seen)| (name.as_str(), format!("{seen:?}"))).collect();
        let dump = json!({"error": e, "epoch": deep["epoch"], "log": format!("{log:?}"), "clients": seen});
        let _ = std::fs::write(&path, dump.to_string());
        panic!("seed {seed} ({store}): {e} (what each client saw: {path})")
    });
    checker::stored_once(&log).unwrap_or_else(|e| panic!("seed {seed} ({store}): {e}"));
    let delivered = inbox.check(&log).unwrap_or_else(|e| panic!("seed {seed} ({store}): the peer's inbox: {e}"));
    let promoted = db.as_ref().is_some_and(|d| d.promoted);
    let kept: Vec<&(i64, Value)> = acknowledged.iter().filter(|(id, body)| log.iter().any(|(i, b)| i == id && b == body)).collect();
    let lost = acknowledged.len() - kept.len();
    // Every 201 is in the log, but what a promotion lost: ids after its
    // fork and up to its base. Without one, no client is told of a loss.
    let owed: Vec<(i64, Value)> = acknowledged.iter().filter(|(id, _)| !promoted || *id <= fork || *id > base).cloned().collect();
    checker::acknowledged_kept(&log, &owed).unwrap_or_else(|e| panic!("seed {seed} ({store}): {e}"));
    if !promoted {
        assert_eq!(verdict.announced, 0, "seed {seed} ({store}): a loss announced without a promotion");
        assert_eq!(delivered.announced, 0, "seed {seed} ({store}): a loss announced to the inbox without a promotion");
    }
    figures.inbox_notifications_checked = delivered.events;
    figures.inbox_losses_announced = delivered.announced;
    figures.publishes_acknowledged = acknowledged.len() as u64;
    figures.publish_attempts_refused = refused.load(Ordering::Relaxed);
    figures.events_in_final_log = log.len();
    figures.events_checked = verdict.events;
    figures.losses_announced = verdict.announced;
    figures.events_seen_then_lost = verdict.lost;
    figures.acknowledged_lost_in_promotion = lost;
    figures
}

/// The campaign the suite runs: both stores, one seed (printed, so a
/// failure can be replayed with `TIDINGS_CHAOS_SEED`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seeded_fault_campaign_loses_repeats_and_reorders_nothing() {
    let (seed, seconds) = run_settings();
    eprintln!("fault campaign: TIDINGS_CHAOS_SEED={seed} TIDINGS_CHAOS_SECONDS={seconds}");
    for store in ["postgres", "embedded"] {
        let figures = campaign(store, seed, seconds).await;
        let line = figures.to_json().to_string();
        eprintln!("fault campaign figures: {line}");
        if let Ok(path) = std::env::var("TIDINGS_CHAOS_REPORT") {
            use std::io::Write as _;
            let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
            writeln!(file, "{line}").unwrap();
        }
        assert!(figures.events_checked > 0 && figures.faults.values().sum::<u64>() > 0, "{line}");
    }
}
