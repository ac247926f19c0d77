//! The Python client (`clients/python`): its pytest suite
//! (`clients/python/tests`) runs against real servers on each store, which
//! it starts from this binary's environment and restarts itself: publishing
//! retried after a lost answer without storing twice, refusals not retried,
//! streams that resume across a restart, a slow drop (a blocking iterator
//! not read, an `async for` not awaited) and a replay gap, durable
//! consumers that acknowledge only what the loop body finished, the
//! WebSocket device, and expired tokens replaced through the `token`
//! function. The package passes `mypy --strict`. `scripts/test` makes the
//! virtual environment (`TIDINGS_TEST_PYCLIENT`) with the pinned
//! `clients/python/requirements-test.txt` and the client installed editable.

use std::time::Duration;

use crate::both_stores;
use crate::helpers::{Backend, process_store};

both_stores!(client_scenarios_pass, the_books_example_runs_as_written);

/// The MCP server's tests (`clients/python/tests/test_mcp.py`, through the
/// official MCP Python SDK) run from `tests/api/mcp.rs`; the client's tests
/// are the rest.
const MCP_TESTS: &str = "tests/test_mcp.py";

const CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/clients/python");
const SECRET: &str = "python-client-scenarios-secret-of-enough-bytes";

fn python() -> String {
    let venv = std::env::var("TIDINGS_TEST_PYCLIENT").expect("run scripts/test, which makes the Python client's virtual environment");
    format!("{venv}/bin/python")
}

/// The environment of one server of the pytest suite: its store, plus what
/// `process_command` gives every test server.
fn server(envs: &[(&'static str, String)], extra: &[(&str, &str)]) -> serde_json::Value {
    let mut map = serde_json::Map::new();
    map.insert("TIDINGS_REGISTRY".into(), concat!(env!("CARGO_MANIFEST_DIR"), "/registry").into());
    map.insert("TIDINGS_DRAIN_DELAY".into(), "0s".into());
    map.insert("TIDINGS_DRAIN".into(), "0s".into());
    for (k, v) in envs {
        map.insert((*k).into(), v.clone().into());
    }
    for (k, v) in extra {
        map.insert((*k).into(), (*v).into());
    }
    map.into()
}

async fn client_scenarios_pass(backend: Backend) {
    run_pytest(backend, &["tests", "--ignore", MCP_TESTS]).await;
}

/// Runs pytest in `clients/python` with `args`, against a `main`, a `slow`
/// and an `auth` server on `backend` (which the tests start themselves).
pub(crate) async fn run_pytest(backend: Backend, args: &[&str]) {
    let (main, _main_dir) = process_store(backend).await;
    let (slow, _slow_dir) = process_store(backend).await;
    let (auth, _auth_dir) = process_store(backend).await;
    let servers = serde_json::json!({
        "main": server(&main, &[]),
        // The slow-drop scenarios need a small queue and a short timeout; the
        // eviction grace is long so the notice is still there once the client reads.
        "slow": server(&slow, &[("TIDINGS_CLIENT_QUEUE", "8"), ("TIDINGS_SLOW_CLIENT_TIMEOUT", "300ms"), ("TIDINGS_EVICTION_GRACE", "30s")]),
        "auth": server(&auth, &[("TIDINGS_JWT_HS256_SECRET", SECRET)]),
    });
    let out = tokio::time::timeout(
        Duration::from_secs(300),
        tokio::process::Command::new(python())
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs"])
            .args(args)
            .current_dir(CLIENT)
            .env("TIDINGS_BIN", env!("CARGO_BIN_EXE_tidings"))
            .env("TIDINGS_TEST_SERVERS", servers.to_string())
            .env("TIDINGS_AUTH_SECRET", SECRET)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("pytest ends within five minutes")
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "pytest failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    // Every test ran: none skipped, none deselected.
    let summary = stdout.lines().rev().find(|l| l.contains(" passed")).unwrap_or_default();
    assert!(!summary.contains("skipped") && !summary.contains("deselected") && !summary.contains("xfail"), "{stdout}");
}

/// The package and its tests pass `mypy --strict` (the settings in
/// `clients/python/pyproject.toml`).
#[test]
fn the_client_is_typed() {
    let out = std::process::Command::new(python()).args(["-m", "mypy", "src", "tests", "bench"]).current_dir(CLIENT).output().unwrap();
    assert!(out.status.success(), "mypy --strict: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

/// Runs the first Python block of the book's chapter `doc` (a path under
/// `docs/`) after `marker`, as written,
/// with the Python client's pinned environment, against a server with
/// authentication on (`TIDINGS_URL`, `TIDINGS_TOKEN` for `sub` `agent-7`
/// with `globs` to publish and subscribe); answers what it printed.
pub(crate) async fn run_doc_example(backend: Backend, doc: &str, marker: &str, globs: &[&str]) -> String {
    let text = std::fs::read_to_string(format!("{}/docs/{doc}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let after = text.split_once(marker).unwrap_or_else(|| panic!("docs/{doc} has {marker:?}")).1;
    let code = after.split_once("```python\n").unwrap().1.split_once("```").unwrap().0;
    let (mut envs, dir) = crate::helpers::process_store(backend).await;
    envs.push(("TIDINGS_JWT_HS256_SECRET", crate::helpers::tokens::SECRET.to_owned()));
    let server = crate::helpers::spawn_process(&envs).await;
    let script = dir.path().join("readme_example.py");
    std::fs::write(&script, code).unwrap();
    let token = crate::helpers::tokens::token("agent-7", serde_json::json!({"publish": globs, "subscribe": globs}));
    let run = tokio::process::Command::new(python())
        .arg(&script)
        .env("TIDINGS_URL", &server.base)
        .env("TIDINGS_TOKEN", &token)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(60), run).await.expect("the example ends").unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the example in docs/{doc} after {marker:?} failed:\n{stdout}\n{stderr}");
    stdout.into_owned()
}

/// The book's Python client example, run as written: it prints the
/// event its new consumer was created in time to see.
async fn the_books_example_runs_as_written(backend: Backend) {
    let stdout = run_doc_example(backend, "clients.md", "## Python client", &["task.*"]).await;
    assert_eq!(stdout.trim(), "{'id': 7}");
}
