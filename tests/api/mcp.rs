//! `POST /mcp`, the Model Context Protocol server, driven by the official
//! MCP Python SDK (`mcp`, pinned in `clients/python/requirements-test.txt`)
//! on each store: the handshake and tool list with schemas, publish then
//! poll, a durable consumer acknowledged across two sessions, a CAS
//! conflict as a tool error with `hash_mismatch`, tools hidden from a token
//! whose grants cannot use them and refused when called anyway (nothing
//! stored), and bad calls refused with stable codes while the server keeps
//! serving. The tests live in `clients/python/tests/test_mcp.py`. The
//! README's MCP example runs here as it is written.

use crate::both_stores;
use crate::helpers::Backend;
use crate::python_client::run_pytest;

both_stores!(the_mcp_sdk_uses_every_tool_within_the_grants, the_readme_mcp_example_runs_as_written);

async fn the_mcp_sdk_uses_every_tool_within_the_grants(backend: Backend) {
    run_pytest(backend, &["tests/test_mcp.py"]).await;
}

/// The README's MCP example (the Python block after "From Python, with the
/// official SDK"), run as written with the SDK the suite pins, against a
/// server with authentication on: it prints the event it published.
async fn the_readme_mcp_example_runs_as_written(backend: Backend) {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let after = readme.split_once("From Python, with the official SDK").expect("the README's MCP example").1;
    let code = after.split_once("```python\n").unwrap().1.split_once("```").unwrap().0;
    let (mut envs, dir) = crate::helpers::process_store(backend).await;
    envs.push(("TIDINGS_JWT_HS256_SECRET", crate::security::SECRET.to_owned()));
    let server = crate::helpers::spawn_process(&envs).await;
    let script = dir.path().join("readme_mcp.py");
    std::fs::write(&script, code).unwrap();
    let token = crate::security::token("agent-7", serde_json::json!({"publish": ["task.*"], "subscribe": ["task.*"]}));
    let venv = std::env::var("TIDINGS_TEST_PYCLIENT").expect("run scripts/test, which makes the Python client's virtual environment");
    let run = tokio::process::Command::new(format!("{venv}/bin/python"))
        .arg(&script)
        .env("TIDINGS_URL", &server.base)
        .env("TIDINGS_TOKEN", &token)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(60), run).await.expect("the example ends").unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the example failed:\n{stdout}\n{stderr}");
    assert_eq!(stdout.trim(), "[{'id': 7}]", "{stderr}");
}
