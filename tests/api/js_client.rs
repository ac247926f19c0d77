//! The JavaScript client (`clients/js`): its scenarios
//! (`clients/js/test/scenarios.mjs`) run in Node's test runner and in
//! headless Chromium against real servers on each store: replay and live,
//! a lost connection, a replay gap, a server swapped for one with a shorter
//! log, a handler that throws, a slow-client drop with a lossless resume,
//! refusals that are not retried, polls and durable consumers, the
//! WebSocket device resuming from its acknowledged cursor, and expired
//! tokens replaced through the `token` function (a server with tokens on). The compiled
//! module in `clients/js/dist` (what the server embeds and serves at
//! `/tidings.js`) must be what the TypeScript compiles to.
//! `scripts/test` installs the node modules (`npm ci` in `clients/js`).

use std::path::Path;
use std::time::Duration;

use crate::both_stores;
use crate::helpers::{Backend, free_port, process_store, spawn_app, spawn_process_at};

both_stores!(client_scenarios_pass_in_node_and_in_chromium, the_server_serves_the_compiled_client);

const CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/clients/js");

async fn client_scenarios_pass_in_node_and_in_chromium(backend: Backend) {
    assert!(Path::new(CLIENT).join("node_modules/typescript").is_dir(), "run scripts/test, which installs the client's node modules");
    let (main_envs, _main_dir) = process_store(backend).await;
    let main = spawn_process_at(&main_envs, free_port()).await;
    // The slow-client scenarios need a small queue and a short timeout; the
    // eviction grace is long so the notice is still there once the client reads.
    let (mut slow_envs, _slow_dir) = process_store(backend).await;
    slow_envs.extend([
        ("TIDINGS_CLIENT_QUEUE", "8".to_owned()),
        ("TIDINGS_SLOW_CLIENT_TIMEOUT", "300ms".to_owned()),
        ("TIDINGS_EVICTION_GRACE", "30s".to_owned()),
    ]);
    let slow = spawn_process_at(&slow_envs, free_port()).await;
    // Only the server-swap scenarios publish here: its ids stay low.
    let (other_envs, _other_dir) = process_store(backend).await;
    let other = spawn_process_at(&other_envs, free_port()).await;
    // Tokens on: the token-refresh scenarios mint short-lived tokens.
    let secret = "js-client-scenarios-secret-of-enough-bytes";
    let (mut auth_envs, _auth_dir) = process_store(backend).await;
    auth_envs.push(("TIDINGS_JWT_HS256_SECRET", secret.to_owned()));
    let auth = spawn_process_at(&auth_envs, free_port()).await;
    for (runner, flags) in [("test/node.test.mjs", &["--experimental-websocket"][..]), ("test/browser.test.mjs", &[][..])] {
        let out = tokio::time::timeout(
            Duration::from_secs(240),
            tokio::process::Command::new("node")
                .args(flags)
                .arg("--test")
                .arg(runner)
                .current_dir(CLIENT)
                .env("TIDINGS_URL", &main.base)
                .env("TIDINGS_SLOW_URL", &slow.base)
                .env("TIDINGS_OTHER_URL", &other.base)
                .env("TIDINGS_AUTH_URL", &auth.base)
                .env("TIDINGS_AUTH_SECRET", secret)
                .kill_on_drop(true)
                .output(),
        )
        .await
        .unwrap_or_else(|_| panic!("{runner} ends within four minutes"))
        .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{runner} failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        // Every scenario ran (none skipped, none left out of the count).
        assert!(stdout.contains("# fail 0") && stdout.contains("# skipped 0"), "{stdout}");
        assert!(!stdout.contains("# pass 0"), "{stdout}");
    }
}

/// The client's types take what the server takes (`clients/js/test/types.ts`,
/// type-checked strictly): an agent without a kind, say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_types_take_what_the_server_takes() {
    let out = tokio::process::Command::new("node")
        .arg("node_modules/typescript/bin/tsc")
        .args(["--noEmit", "-p", "test"])
        .current_dir(CLIENT)
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "tsc: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

/// `/tidings.js` is the committed build, which is what `tsc` makes of the
/// source now; it is revalidated by `ETag`.
async fn the_server_serves_the_compiled_client(backend: Backend) {
    let built = tempfile::tempdir().unwrap();
    let out = tokio::process::Command::new("node")
        .arg("node_modules/typescript/bin/tsc")
        .args(["-p", ".", "--outDir"])
        .arg(built.path())
        .current_dir(CLIENT)
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "tsc: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    for file in ["tidings.js", "tidings.d.ts"] {
        let committed = std::fs::read_to_string(Path::new(CLIENT).join("dist").join(file)).unwrap();
        let fresh = std::fs::read_to_string(built.path().join(file)).unwrap();
        assert!(committed == fresh, "clients/js/dist/{file} is stale: run `npm run build` in clients/js");
    }

    let app = spawn_app(backend).await;
    let r = app.http.get(app.url("/tidings.js")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/javascript; charset=utf-8");
    assert_eq!(r.headers()["cache-control"], "no-cache");
    let etag = r.headers()["etag"].to_str().unwrap().to_owned();
    let body = r.text().await.unwrap();
    assert_eq!(body, std::fs::read_to_string(Path::new(CLIENT).join("dist/tidings.js")).unwrap());
    let again = app.http.get(app.url("/tidings.js")).header("if-none-match", &etag).send().await.unwrap();
    assert_eq!(again.status(), 304);
    assert!(again.text().await.unwrap().is_empty());
    let other = app.http.get(app.url("/tidings.js")).header("if-none-match", "\"something-else\"").send().await.unwrap();
    assert_eq!(other.status(), 200);
}
