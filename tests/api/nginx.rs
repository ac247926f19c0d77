//! The shipped `deploy/nginx/tidings.conf`, run by the distribution's nginx
//! (`scripts/test` installs it) in front of a real server, with only its
//! two addresses and its log path changed: the console page, a same-origin
//! publish, SSE with resume, a poll, the WebSocket device and MCP all pass
//! through it with authentication on; with authentication off the console,
//! polls and health answer (no `host_refused`); and the access log holds no
//! token.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::both_stores;
use crate::helpers::{Backend, Process, free_port, process_store, spawn_process};

both_stores!(the_shipped_nginx_config_carries_every_transport);

/// The pids of `pid` and its children.
fn family(pid: u32) -> Vec<u32> {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    std::iter::once(pid).chain(children.split_whitespace().filter_map(|c| c.parse().ok())).collect()
}

/// Whether `pid` runs (a zombie waiting to be reaped does not).
fn runs(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with(|c| c != 'Z' && c != 'X')))
        .unwrap_or(false)
}

/// nginx started for a test leaves no process behind when the test ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_leaves_no_process_behind() {
    let (envs, _dir) = process_store(Backend::Embedded).await;
    let server = spawn_process(&envs).await;
    let proxy = Nginx::start(&server.base).await;
    let started = family(proxy.child.id().expect("nginx runs"));
    drop(proxy);
    crate::helpers::eventually("every nginx process is gone", || {
        let started = started.clone();
        async move { !started.iter().any(|pid| runs(*pid)) }
    })
    .await;
}

/// nginx running the shipped config in front of `upstream` (a base URL).
struct Nginx {
    child: tokio::process::Child,
    base: String,
    access_log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Nginx {
    async fn start(upstream: &str) -> Nginx {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let access_log = dir.path().join("tidings.access.log");
        let shipped = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/nginx/tidings.conf")).unwrap();
        let mut conf = shipped.clone();
        for (from, to) in [
            ("server 127.0.0.1:8080;", format!("server {};", upstream.trim_start_matches("http://"))),
            ("listen 80;", format!("listen 127.0.0.1:{port};")),
            ("/var/log/nginx/tidings.access.log", access_log.display().to_string()),
        ] {
            assert_eq!(shipped.matches(from).count(), 1, "the shipped config has {from} once");
            conf = conf.replace(from, &to);
        }
        std::fs::write(dir.path().join("tidings.conf"), conf).unwrap();
        let p = |name: &str| dir.path().join(name).display().to_string();
        // One process, no master: killing it when the test ends leaves
        // nothing behind (a killed master's workers would live on,
        // orphaned, after every run of the suite).
        // Run as root (a container's CI), nginx's workers would be `nobody`
        // and could not write the temporary directories.
        let user = if nix_uid_is_root() { "user root root;" } else { "" };
        let main = format!(
            "{user}\nmaster_process off;\ndaemon off;\npid {pid};\nerror_log {error} error;\nevents {{ worker_connections 256; }}\n\
             http {{\n  client_body_temp_path {body};\n  proxy_temp_path {proxy};\n  fastcgi_temp_path {fcgi};\n  uwsgi_temp_path {uwsgi};\n  \
             scgi_temp_path {scgi};\n  include {conf};\n}}\n",
            pid = p("nginx.pid"),
            error = p("error.log"),
            body = p("body"),
            proxy = p("proxy"),
            fcgi = p("fcgi"),
            uwsgi = p("uwsgi"),
            scgi = p("scgi"),
            conf = p("tidings.conf"),
        );
        std::fs::write(dir.path().join("nginx.conf"), main).unwrap();
        let child = tokio::process::Command::new(nginx())
            .args(["-p", &p(""), "-c", &p("nginx.conf")])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("starting nginx");
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        crate::helpers::eventually("nginx answers", || async { http.get(format!("{base}/health")).send().await.is_ok() }).await;
        Nginx { child, base, access_log, _dir: dir }
    }
}

fn nginx() -> &'static Path {
    let path = Path::new("/usr/sbin/nginx");
    assert!(path.is_file(), "nginx is needed (scripts/test installs Debian's nginx package)");
    path
}

fn nix_uid_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}

async fn the_shipped_nginx_config_carries_every_transport(backend: Backend) {
    // Authentication on.
    let (mut envs, dir) = process_store(backend).await;
    envs.push(("TIDINGS_JWT_HS256_SECRET", crate::helpers::tokens::SECRET.to_owned()));
    let server = spawn_process(&envs).await;
    let mut proxy = Nginx::start(&server.base).await;
    let base = proxy.base.clone();
    let token = crate::helpers::tokens::token("persona:nginx", json!({"publish": ["probe.*"], "subscribe": ["probe.*"]}));
    let http = reqwest::Client::new();

    let console = http.get(format!("{base}/")).send().await.unwrap();
    assert_eq!(console.status(), 200, "the console page");
    // The console's publish: same origin as the page, through the proxy.
    let publish = |n: i64| {
        http.post(format!("{base}/v1/events"))
            .header("origin", &base)
            .bearer_auth(&token)
            .json(&json!({"event_type": "probe.passed", "payload": {"n": n}}))
            .send()
    };
    let mut ids = Vec::new();
    for n in 0..3 {
        let r = publish(n).await.unwrap();
        let status = r.status();
        let body: Value = r.json().await.unwrap();
        assert_eq!(status, 201, "a same-origin publish through nginx: {body}");
        ids.push(body["event_ids"][0].as_i64().unwrap());
    }
    // SSE, resumed after the first event, with the token in the URL as a browser sends it.
    let stream_url = format!("{base}/v1/stream?types=probe.*&access_token={token}");
    let mut reader = tidings_client::sse::connect(&http, &stream_url, Some(ids[0])).await.expect("a stream through nginx");
    let mut got = Vec::new();
    while got.len() < 2 {
        let event = tokio::time::timeout(Duration::from_secs(10), reader.next_event()).await.expect("frames through nginx").unwrap();
        if event.event.is_none() {
            got.push(event.id.unwrap().parse::<i64>().unwrap());
        }
    }
    assert_eq!(got, ids[1..], "resumed after Last-Event-ID");
    // A live frame arrives at once (nothing buffered).
    let live = publish(3).await.unwrap().json::<Value>().await.unwrap()["event_ids"][0].as_i64().unwrap();
    let event = tokio::time::timeout(Duration::from_secs(5), reader.next_event()).await.expect("a live frame, unbuffered").unwrap();
    assert_eq!(event.id.as_deref(), Some(live.to_string().as_str()));
    drop(reader);
    // A poll.
    let page: Value =
        http.get(format!("{base}/v1/poll?types=probe.*&since=0")).bearer_auth(&token).send().await.unwrap().json().await.unwrap();
    assert_eq!(page["events"].as_array().map(Vec::len), Some(4), "{page}");
    // The WebSocket device, its token in the URL as a browser sends it.
    let key = tidings_server::keyfile::open(&dir.path().join("device.key")).unwrap();
    let ws_url = format!("{}/v1/ws?access_token={token}", base.replace("http://", "ws://"));
    let mut device = tidings_client::device::DeviceClient::connect(&ws_url).await.expect("a WebSocket upgrade through nginx");
    let answer = device.auth(&key, json!({"device_id": "behind-nginx", "filter": {"types": ["probe.*"]}})).await.unwrap();
    assert_eq!(answer["head_seq"].as_i64(), Some(live), "{answer}");
    let pushed = publish(4).await.unwrap().json::<Value>().await.unwrap()["event_ids"][0].as_i64().unwrap();
    let frame = tokio::time::timeout(Duration::from_secs(5), device.next_text()).await.expect("a live frame on the device").unwrap();
    let frame: Value = serde_json::from_str(&frame).unwrap();
    assert_eq!((frame["method"].as_str(), frame["params"]["seq"].as_i64()), (Some("stream.event"), Some(pushed)), "{frame}");
    drop(device);
    // MCP.
    let tools: Value = http
        .post(format!("{base}/mcp"))
        .bearer_auth(&token)
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(tools["result"]["tools"].as_array().is_some_and(|t| !t.is_empty()), "{tools}");
    // The access log: every request, no token.
    proxy.child.kill().await.unwrap();
    let log = std::fs::read_to_string(&proxy.access_log).unwrap();
    assert!(log.contains("/v1/stream?types=probe.*&access_token=REDACTED") && log.contains("/v1/ws?access_token=REDACTED"), "{log}");
    assert!(!log.contains(&token) && !log.contains(token.rsplit('.').next().unwrap()), "a token reached the access log:\n{log}");
    drop(server);

    // Authentication off: the console, a poll and health answer through it.
    let (envs, _dir) = process_store(backend).await;
    let open: Process = spawn_process(&envs).await;
    let proxy = Nginx::start(&open.base).await;
    for path in ["/", "/v1/poll?since=0", "/health"] {
        let r = http.get(format!("{}{path}", proxy.base)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path} with auth off");
    }
}
