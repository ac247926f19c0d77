//! The Python client (`clients/python`): its pytest suite
//! (`clients/python/tests`) runs against real servers on each store, which
//! it starts from this binary's environment and restarts itself: publishing
//! retried after a lost answer without storing twice, refusals not retried,
//! streams that resume across a restart, a slow drop (a blocking iterator
//! not read, an `async for` not awaited) and a replay gap, durable
//! consumers that acknowledge only what the loop body finished, the
//! WebSocket device, and expired tokens replaced through the `token`
//! function; and unit tests that need no server (`httpx.MockTransport`),
//! written for asyncio and generated for the blocking client. The package
//! passes `mypy --strict` and `ruff`; its blocking client is what
//! `tools/generate_sync.py` writes from the asyncio one; its wheel installs
//! into a clean virtual environment with no index and works there.
//! `scripts/test` makes the virtual environment (`TIDINGS_TEST_PYCLIENT`)
//! with the pinned `clients/python/requirements-test.txt` (the lock), the
//! client installed editable, and a wheelhouse of its runtime dependencies.

use std::time::Duration;

use crate::both_stores;
use crate::helpers::{Backend, process_store};

both_stores!(client_scenarios_pass, the_books_example_runs_as_written, the_wheel_installs_into_a_clean_environment_and_works);

/// The MCP server's tests (`clients/python/tests/test_mcp.py`, through the
/// official MCP Python SDK) run from `tests/api/mcp.rs`; the client's tests
/// are the rest.
const MCP_TESTS: &str = "tests/test_mcp.py";

const CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/clients/python");
const SECRET: &str = "python-client-scenarios-secret-of-enough-bytes";

fn venv() -> String {
    std::env::var("TIDINGS_TEST_PYCLIENT").expect("run scripts/test, which makes the Python client's virtual environment")
}

fn python() -> String {
    format!("{}/bin/python", venv())
}

/// Runs `program` with `args` in `dir` (with `envs`), within two minutes:
/// its status and what it wrote.
fn run_in(dir: &std::path::Path, program: &str, args: &[&str], envs: &[(&str, &str)]) -> (bool, String) {
    let mut child = std::process::Command::new(program)
        .args(args)
        .current_dir(dir)
        .envs(envs.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("{program} {args:?} ends within two minutes");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
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
        // Streams compressed: httpx asks for gzip, and every scenario on
        // this server reads its streams through it.
        "main": server(&main, &[("TIDINGS_COMPRESSION", "on")]),
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

/// The package, its tests and tools pass `mypy --strict`, `ruff check` and
/// `ruff format --check` (the settings in `clients/python/pyproject.toml`).
#[test]
fn the_client_is_typed_and_linted() {
    let dir = std::path::Path::new(CLIENT);
    for (program, args) in [
        (python(), &["-m", "mypy", "src", "tests", "bench", "tools"][..]),
        (format!("{}/bin/ruff", venv()), &["check", "--no-cache", "src", "tests", "bench", "tools"][..]),
        (format!("{}/bin/ruff", venv()), &["format", "--no-cache", "--check", "src", "tests", "bench", "tools"][..]),
    ] {
        let (ok, said) = run_in(dir, &program, args, &[]);
        assert!(ok, "{program} {args:?}: {said}");
    }
}

/// The blocking client (and its unit tests) are what `tools/generate_sync.py`
/// writes from the asyncio ones; and its check fails on drift: in a copy
/// whose blocking client was edited by hand, it names the file.
#[test]
fn the_blocking_client_is_generated_from_the_asyncio_one() {
    let dir = std::path::Path::new(CLIENT);
    let (ok, said) = run_in(dir, &python(), &["tools/generate_sync.py", "--check"], &[]);
    assert!(ok, "tools/generate_sync.py --check: {said}");

    let copy = tempfile::tempdir().unwrap();
    for sub in ["tools", "tests", "src/tidings/_async", "src/tidings/_sync"] {
        std::fs::create_dir_all(copy.path().join(sub)).unwrap();
        for entry in std::fs::read_dir(dir.join(sub)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "py") {
                std::fs::copy(&path, copy.path().join(sub).join(path.file_name().unwrap())).unwrap();
            }
        }
    }
    let (ok, said) = run_in(copy.path(), &python(), &["tools/generate_sync.py", "--check"], &[]);
    assert!(ok, "the copy is as generated: {said}");
    let edited = copy.path().join("src/tidings/_sync/client.py");
    let text = std::fs::read_to_string(&edited).unwrap();
    std::fs::write(&edited, text.replacen("def publish(", "def publish_by_hand(", 1)).unwrap();
    let (ok, said) = run_in(copy.path(), &python(), &["tools/generate_sync.py", "--check"], &[]);
    assert!(!ok && said.contains("src/tidings/_sync/client.py is stale"), "{said}");
}

/// The wheel built from `clients/python` (with its declared backend)
/// installs into a clean virtual environment from nothing but itself and a
/// wheelhouse of its runtime dependencies (no index: what it declares must
/// be enough), and a program there, outside the source tree, uses it in
/// both flavours: a blocking publish and stream, then an asyncio one.
async fn the_wheel_installs_into_a_clean_environment_and_works(backend: Backend) {
    let scratch = tempfile::tempdir().unwrap();
    let wheels = scratch.path().join("wheels");
    let scratch_path = scratch.path().to_owned();
    let (envs, _dir) = process_store(backend).await;
    let server = crate::helpers::spawn_process(&envs).await;
    let base = server.base.clone();
    let said = tokio::task::spawn_blocking(move || {
        let here = std::path::Path::new(CLIENT);
        let wheel_dir = wheels.to_str().unwrap();
        let (ok, said) = run_in(
            here,
            &python(),
            &["-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--no-deps", "--no-build-isolation", "-w", wheel_dir, "."],
            &[],
        );
        assert!(ok, "pip wheel: {said}");
        let wheel = std::fs::read_dir(&wheels)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|e| e == "whl"))
            .expect("a wheel");
        let clean = scratch_path.join("clean");
        let (ok, said) = run_in(&scratch_path, &python(), &["-m", "venv", clean.to_str().unwrap()], &[]);
        assert!(ok, "venv: {said}");
        let pip = clean.join("bin/pip");
        let house = format!("{}/wheelhouse", venv());
        let (ok, said) = run_in(
            &scratch_path,
            pip.to_str().unwrap(),
            &["install", "--quiet", "--disable-pip-version-check", "--no-index", "--find-links", &house, wheel.to_str().unwrap()],
            &[],
        );
        assert!(ok, "pip install the wheel: {said}");
        std::fs::write(
            scratch_path.join("use.py"),
            r#"import asyncio, json, os, tidings

url = os.environ["TIDINGS_URL"]
only = {"types": ["wheel.*"]}
with tidings.Client(url) as client:
    ids = client.publish([{"event_type": "wheel.one"}, {"event_type": "wheel.two"}])
    stream = client.stream(only, since=0)
    blocking = [(next(stream).event_id) for _ in range(2)]
    stream.close()

async def main() -> list[int]:
    async with tidings.AsyncClient(url) as client:
        await client.publish({"event_type": "wheel.three"})
        async with client.stream(only, since=0) as stream:
            return [(await stream.__anext__()).event_id for _ in range(3)]

print(json.dumps({"ids": list(ids), "blocking": blocking, "asyncio": asyncio.run(main()), "from": tidings.__file__}))
"#,
        )
        .unwrap();
        let (ok, said) = run_in(&scratch_path, clean.join("bin/python").to_str().unwrap(), &["use.py"], &[("TIDINGS_URL", &base)]);
        assert!(ok, "the program in the clean environment: {said}");
        said
    })
    .await
    .unwrap();
    let said: serde_json::Value = serde_json::from_str(said.trim()).unwrap_or_else(|e| panic!("{e}: {said}"));
    let ids = said["ids"].as_array().unwrap();
    assert_eq!(ids.len(), 2, "{said}");
    assert_eq!(said["blocking"], serde_json::json!(ids));
    let asyncio = said["asyncio"].as_array().unwrap();
    assert_eq!(&asyncio[..2], &ids[..], "{said}");
    assert!(asyncio[2].as_u64().unwrap() > ids[1].as_u64().unwrap());
    let from = said["from"].as_str().unwrap();
    assert!(from.contains("/clean/lib/") && !from.contains("clients/python"), "imported from the wheel, not the source: {from}");
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
