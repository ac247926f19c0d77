//! `POST /mcp`, the Model Context Protocol server, driven by the official
//! MCP Python SDK (`mcp`, pinned in `clients/python/requirements-test.txt`)
//! on each store: the handshake and tool list with schemas, publish then
//! poll, a durable consumer acknowledged across two sessions, a CAS
//! conflict as a tool error with `hash_mismatch`, tools hidden from a token
//! whose grants cannot use them and refused when called anyway (nothing
//! stored), and bad calls refused with stable codes while the server keeps
//! serving. The tests live in `clients/python/tests/test_mcp.py`. The
//! book's MCP example (docs/mcp.md) runs here as it is written.

use crate::both_stores;
use crate::helpers::Backend;
use crate::python_client::run_pytest;

both_stores!(the_mcp_sdk_uses_every_tool_within_the_grants, the_books_mcp_example_runs_as_written);

async fn the_mcp_sdk_uses_every_tool_within_the_grants(backend: Backend) {
    run_pytest(backend, &["tests/test_mcp.py"]).await;
}

/// The book's MCP example (the Python block after "From Python, with the
/// official SDK"), run as written with the SDK the suite pins, against a
/// server with authentication on: it prints the event it published.
async fn the_books_mcp_example_runs_as_written(backend: Backend) {
    let stdout = crate::python_client::run_doc_example(backend, "mcp.md", "From Python, with the official SDK", &["task.*"]).await;
    assert_eq!(stdout.trim(), "[{'id': 7}]");
}
