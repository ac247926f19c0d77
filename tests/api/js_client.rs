//! The JavaScript client (`clients/js`): its scenarios
//! (`clients/js/test/scenarios.mjs`) run in Node's test runner and in
//! headless Chromium against real servers on each store: replay and live,
//! a lost connection, a replay gap, a server swapped for one with a shorter
//! log, a handler that throws, a slow-client drop with a lossless resume,
//! refusals that are not retried, polls and durable consumers, the
//! WebSocket device resuming from its acknowledged cursor, and expired
//! tokens replaced through the `token` function (a server with tokens on).
//! Its unit tests (`npm test`, `clients/js/test/unit`) run with no server at
//! all, over a fake `fetch` and `WebSocket`. The built module in
//! `clients/js/dist` (what the server embeds and serves at `/tidings.js`)
//! must be what `build.mjs` makes of the source now, and the package `npm
//! pack` makes installs into a clean project and works there, in
//! JavaScript and in strict TypeScript.
//! `scripts/test` installs the node modules (`npm ci` in `clients/js`).

use std::path::Path;
use std::time::Duration;

use crate::both_stores;
use crate::helpers::{Backend, free_port, process_store, spawn_app, spawn_process_at};

both_stores!(
    client_scenarios_pass_in_node_and_in_chromium,
    the_server_serves_the_compiled_client,
    the_packed_client_installs_into_a_clean_project_and_works
);

const CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/clients/js");

async fn client_scenarios_pass_in_node_and_in_chromium(backend: Backend) {
    assert!(Path::new(CLIENT).join("node_modules/typescript").is_dir(), "run scripts/test, which installs the client's node modules");
    // Streams compressed: Node's fetch and Chromium ask for gzip, and the
    // scenarios read it as they read a plain stream.
    let (mut main_envs, _main_dir) = process_store(backend).await;
    main_envs.push(("TIDINGS_COMPRESSION", "on".to_owned()));
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
        let compressed = main.metric(COMPRESSED).await;
        let out = crate::helpers::output_within(
            tokio::process::Command::new("node")
                .args(flags)
                .arg("--test")
                .arg(runner)
                .current_dir(CLIENT)
                .env("TIDINGS_URL", &main.base)
                .env("TIDINGS_SLOW_URL", &slow.base)
                .env("TIDINGS_OTHER_URL", &other.base)
                .env("TIDINGS_AUTH_URL", &auth.base)
                .env("TIDINGS_AUTH_SECRET", secret),
            Duration::from_secs(240),
        )
        .await
        .unwrap_or_else(|| panic!("{runner} ends within four minutes"));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{runner} failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        // Every scenario ran (none skipped, none left out of the count).
        assert!(stdout.contains("# fail 0") && stdout.contains("# skipped 0"), "{stdout}");
        assert!(!stdout.contains("# pass 0"), "{stdout}");
        assert!(main.metric(COMPRESSED).await > compressed, "{runner}: the scenarios' streams were compressed");
    }
}

const COMPRESSED: &str = "tidings_streams_compressed_total";

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

/// `npm test` runs the unit tests, which need no server: none is named in
/// its environment, and every test passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn npm_test_needs_no_server() {
    let mut command = tokio::process::Command::new("npm");
    command.args(["test", "--silent"]).current_dir(CLIENT);
    for name in ["TIDINGS_URL", "TIDINGS_SLOW_URL", "TIDINGS_OTHER_URL", "TIDINGS_AUTH_URL", "TIDINGS_AUTH_SECRET"] {
        command.env_remove(name);
    }
    let out = crate::helpers::output_within(&mut command, Duration::from_secs(120)).await.expect("npm test ends within two minutes");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "npm test failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("# fail 0") && stdout.contains("# skipped 0") && !stdout.contains("# pass 0"), "{stdout}");
}

/// Runs `program` with `args` in `dir`, within a minute; its standard output.
async fn run(program: &str, args: &[&str], dir: &Path, envs: &[(&str, &str)]) -> String {
    let out = crate::helpers::output_within(
        tokio::process::Command::new(program).args(args).current_dir(dir).envs(envs.iter().copied()),
        Duration::from_secs(60),
    )
    .await
    .unwrap_or_else(|| panic!("{program} {args:?} ends within a minute"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{program} {args:?}: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

/// What `npm pack` makes installs into a project that has nothing else
/// (offline: the package has no dependencies), and a program there uses it
/// as a user would: publishes, and iterates a stream until it has both
/// events. A strict TypeScript program type-checks against its declarations.
async fn the_packed_client_installs_into_a_clean_project_and_works(backend: Backend) {
    let scratch = tempfile::tempdir().unwrap();
    let packed: serde_json::Value = serde_json::from_str(
        &run("npm", &["pack", "--json", "--pack-destination", scratch.path().to_str().unwrap()], Path::new(CLIENT), &[]).await,
    )
    .unwrap();
    let files: Vec<&str> = packed[0]["files"].as_array().unwrap().iter().map(|f| f["path"].as_str().unwrap()).collect();
    for shipped in ["dist/tidings.js", "dist/tidings.d.ts", "dist/stream.d.ts", "package.json", "README.md"] {
        assert!(files.contains(&shipped), "{shipped} is in the package: {files:?}");
    }
    assert!(
        files.iter().all(|f| !f.starts_with("src/") && !f.starts_with("test/") && !f.contains("node_modules")),
        "only what users need: {files:?}"
    );
    let tarball = scratch.path().join(packed[0]["filename"].as_str().unwrap());

    let project = scratch.path().join("project");
    std::fs::create_dir(&project).unwrap();
    std::fs::write(project.join("package.json"), r#"{"name": "uses-tidings", "private": true, "type": "module"}"#).unwrap();
    run("npm", &["install", "--offline", "--no-audit", "--no-fund", tarball.to_str().unwrap()], &project, &[]).await;
    std::fs::write(
        project.join("use.mjs"),
        r#"import { createClient } from "@tidings/client";
const client = createClient({ url: process.env.TIDINGS_URL });
const stream = client.stream({ types: ["packed.*"] }, { since: 0, transport: "fetch" });
const ids = await client.publish([{ event_type: "packed.one" }, { event_type: "packed.two", payload: { n: 2 } }]);
const seen = [];
for await (const event of stream) {
  seen.push([event.event_id, event.event_type]);
  if (seen.length === 2) break;
}
console.log(JSON.stringify({ ids: [...ids], replayed: ids.replayed, seen, state: stream.state }));
"#,
    )
    .unwrap();
    let app = spawn_app(backend).await;
    let said: serde_json::Value =
        serde_json::from_str(run("node", &["use.mjs"], &project, &[("TIDINGS_URL", &app.base)]).await.trim()).unwrap();
    let ids = said["ids"].as_array().unwrap().clone();
    assert_eq!(ids.len(), 2, "{said}");
    assert_eq!(said["replayed"], false);
    assert_eq!(said["seen"], serde_json::json!([[ids[0], "packed.one"], [ids[1], "packed.two"]]));
    assert_eq!(said["state"], "closed", "leaving the loop closed the stream");

    std::fs::write(
        project.join("use.ts"),
        r#"import { createClient, TidingsError, type Envelope, type Published } from "@tidings/client";
const client = createClient({ url: "http://localhost:1", token: async () => "token" });
export async function first(): Promise<Envelope | undefined> {
  for await (const event of client.stream({ types: ["a.*"] })) return event;
  return undefined;
}
export const published: Promise<Published> = client.publish({ event_type: "a.b" });
export const code = (e: unknown): string | undefined => (e instanceof TidingsError ? e.code : undefined);
"#,
    )
    .unwrap();
    std::fs::write(
        project.join("tsconfig.json"),
        r#"{"compilerOptions": {"strict": true, "noEmit": true, "module": "nodenext", "moduleResolution": "nodenext", "target": "es2022", "lib": ["es2022", "dom"], "skipLibCheck": false}, "files": ["use.ts"]}"#,
    )
    .unwrap();
    let tsc = Path::new(CLIENT).join("node_modules/typescript/bin/tsc");
    run("node", &[tsc.to_str().unwrap(), "-p", "."], &project, &[]).await;
}

/// `/tidings.js` is the committed build, which is what `build.mjs` makes of
/// the source now (every file of `dist`, none more, none fewer); it is
/// revalidated by `ETag`.
async fn the_server_serves_the_compiled_client(backend: Backend) {
    let scratch = tempfile::tempdir().unwrap();
    let built = scratch.path().join("dist");
    run("node", &["build.mjs", built.to_str().unwrap()], Path::new(CLIENT), &[]).await;
    let listing = |dir: &Path| {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    };
    let committed_dir = Path::new(CLIENT).join("dist");
    assert_eq!(
        listing(&committed_dir),
        listing(&built),
        "clients/js/dist has the files the build makes: run `npm run build` in clients/js"
    );
    for file in listing(&built) {
        let committed = std::fs::read_to_string(committed_dir.join(&file)).unwrap();
        let fresh = std::fs::read_to_string(built.join(&file)).unwrap();
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
