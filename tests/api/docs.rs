//! The README and the book (`docs/`, built with mdBook): the book builds
//! with no warning (`TIDINGS_TEST_MDBOOK`, which `scripts/test` installs),
//! every chapter is in `docs/SUMMARY.md`, every link between them (and to
//! files of the repository) leads somewhere, to a heading that exists when
//! it names one, and the README stays a door of about one screenful of
//! decisions (at most 300 lines).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use pulldown_cmark::{Event, Parser, Tag, TagEnd};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The README's bound, in lines.
const README_LINES: usize = 300;

/// A heading's anchor as mdBook makes it (and GitHub, for the README):
/// lowercase letters and digits, `-` and `_` kept, whitespace made `-`,
/// the rest dropped; a repeat gets `-1`, `-2`, ...
fn anchor(text: &str) -> String {
    text.chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c.to_lowercase().next().unwrap_or(c))
            } else if c.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// What one Markdown file holds: its headings' anchors and its links.
struct Page {
    anchors: BTreeSet<String>,
    links: Vec<String>,
}

fn read(path: &Path) -> Page {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let (mut anchors, mut links, mut seen) = (BTreeSet::new(), Vec::new(), BTreeMap::<String, usize>::new());
    let mut heading: Option<String> = None;
    for event in Parser::new(&text) {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::Text(t) | Event::Code(t) if heading.is_some() => heading.as_mut().unwrap().push_str(&t),
            Event::End(TagEnd::Heading(_)) => {
                let id = anchor(&heading.take().unwrap_or_default());
                let n = seen.entry(id.clone()).or_insert(0);
                anchors.insert(if *n == 0 { id.clone() } else { format!("{id}-{n}") });
                *n += 1;
            }
            Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => links.push(dest_url.to_string()),
            _ => {}
        }
    }
    Page { anchors, links }
}

/// Every Markdown file of the book, and the README.
fn pages() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(Path::new(ROOT).join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    files.push(Path::new(ROOT).join("README.md"));
    files.sort();
    files
}

#[test]
fn every_link_of_the_readme_and_the_book_leads_somewhere() {
    let mut broken = Vec::new();
    let mut cache: BTreeMap<PathBuf, Page> = BTreeMap::new();
    for file in pages() {
        let page = read(&file);
        for link in &page.links {
            // The web is not checked here (offline); mail neither.
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (target, fragment) = link.split_once('#').map_or((link.as_str(), None), |(t, f)| (t, Some(f)));
            let target_path = if target.is_empty() { file.clone() } else { file.parent().unwrap().join(target) };
            if !target_path.exists() {
                broken.push(format!("{}: {link}: no such file", file.display()));
                continue;
            }
            let Some(fragment) = fragment else { continue };
            let anchors = &cache.entry(target_path.clone()).or_insert_with(|| read(&target_path)).anchors;
            if !anchors.contains(fragment) {
                broken.push(format!("{}: {link}: no heading with that anchor", file.display()));
            }
        }
        cache.insert(file, page);
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_chapter_is_in_the_summary_and_the_readme_is_a_door() {
    let summary = read(&Path::new(ROOT).join("docs/SUMMARY.md"));
    let listed: BTreeSet<&str> = summary.links.iter().map(String::as_str).collect();
    let orphans: Vec<String> = pages()
        .iter()
        .filter(|p| p.parent().is_some_and(|d| d.ends_with("docs")))
        .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
        .filter(|name| name != "SUMMARY.md" && !listed.contains(name.as_str()))
        .collect();
    assert!(orphans.is_empty(), "chapters missing from docs/SUMMARY.md: {orphans:?}");
    let lines = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap().lines().count();
    assert!(lines <= README_LINES, "the README has {lines} lines; the book holds what goes past {README_LINES}");
}

/// The book builds with mdBook, and says nothing while it does (a warning
/// fails the suite).
#[test]
fn the_book_builds_without_a_warning() {
    let mdbook = std::env::var("TIDINGS_TEST_MDBOOK")
        .expect("TIDINGS_TEST_MDBOOK is not set: run the suite with scripts/test, which installs mdBook");
    let out_dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(mdbook)
        .args(["build", "docs", "--dest-dir"])
        .arg(out_dir.path())
        .current_dir(ROOT)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "mdbook build failed:\n{stderr}");
    assert!(!stderr.contains("WARN") && !stderr.contains("ERROR"), "mdbook build warned:\n{stderr}");
    assert!(out_dir.path().join("index.html").exists() && out_dir.path().join("failover.html").exists());
}

/// The `sh` blocks of `page` between `from` and `to` (headings), in
/// order, as a reader copies them.
fn shell_blocks(page: &str, from: &str, to: &str) -> Vec<String> {
    let text = std::fs::read_to_string(Path::new(ROOT).join(page)).unwrap();
    let section = text.split_once(from).unwrap_or_else(|| panic!("{page} has {from:?}")).1;
    let section = section.split_once(to).map_or(section, |(s, _)| s);
    section.split("```sh\n").skip(1).map(|b| b.split_once("```").unwrap().0.to_owned()).collect()
}

/// The answers a script shows (`# {...}` under a command), each up to an
/// ellipsis.
fn answers(script: &str) -> Vec<String> {
    script
        .lines()
        .filter_map(|l| l.strip_prefix("# "))
        .map(|answer| answer.split("...").next().unwrap_or(answer).trim_end_matches(',').to_owned())
        .collect()
}

/// Runs `script` in `bash` in `dir` with `tidings` on the `PATH` and the
/// environment `envs`; its standard output and error. A shell still running
/// after `within` gets SIGTERM (by its PID), so that its `EXIT` trap stops
/// what it started.
async fn run_shell(script: &str, dir: &Path, envs: &[(&str, String)], within: std::time::Duration) -> (String, String) {
    let bin = Path::new(env!("CARGO_BIN_EXE_tidings")).parent().unwrap().display().to_string();
    let mut shell = tokio::process::Command::new("bash");
    shell
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .env_clear()
        .env("PATH", format!("{bin}:{}", std::env::var("PATH").unwrap_or_default()))
        .env("HOME", dir)
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = shell.spawn().expect("bash");
    let pid = child.id().expect("a running shell").to_string();
    let out = tokio::time::timeout(within, child.wait_with_output()).await;
    if out.is_err() {
        let _ = std::process::Command::new("kill").args(["-TERM", &pid]).status();
    }
    let out = out.expect("the script ends").unwrap();
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The README's five-minute tour, run as written: its commands in one
/// shell, in order, with `tidings` on the `PATH` and in a directory of its
/// own. Only the address changes (`localhost:8080` to a free port, which
/// `TIDINGS_LISTEN` gives the server); `curl` tries again while the
/// server the tour just started is not listening yet, and gives up on the
/// endless stream after a few seconds, as a reader would with Ctrl-C. Each answer the tour shows
/// (`# {...}` under a command) is in what the shell printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_tour_runs_as_written() {
    let blocks = shell_blocks("README.md", "## A five-minute tour", "## Which transport");
    assert!(blocks.len() >= 4, "the tour has its commands: {blocks:?}");
    let port = crate::helpers::free_port();
    let script = blocks.join("\n").replace("localhost:8080", &format!("127.0.0.1:{port}"));
    let expected = answers(&script);
    assert!(!expected.is_empty(), "the tour shows its answers");
    let dir = tempfile::tempdir().unwrap();
    // curl: again while nothing listens yet (exit 7: the server the tour
    // started is still starting), at most 100 times; 5 s at most each.
    // The server the tour starts (its first background job) ends with the
    // shell, however the shell ends but SIGKILL.
    let prelude = "trap 'kill %1 2>/dev/null' EXIT\n\
        curl() { for _ in $(seq 100); do command curl --max-time 5 \"$@\"; rc=$?; [ $rc -ne 7 ] && return $rc; sleep 0.1; done; }\n";
    let envs =
        [("TIDINGS_LISTEN", format!("127.0.0.1:{port}")), ("TIDINGS_DRAIN_DELAY", "0s".to_owned()), ("TIDINGS_DRAIN", "0s".to_owned())];
    let (stdout, stderr) = run_shell(&format!("{prelude}{script}\n"), dir.path(), &envs, std::time::Duration::from_secs(90)).await;
    for answer in &expected {
        assert!(stdout.contains(answer.as_str()), "the tour's answer {answer:?} is not in what it printed:\n{stdout}\n{stderr}");
    }
    // The stream showed the event published, and the consumer was acked.
    assert!(stdout.contains("id: 1\n") && stdout.contains(r#"{"consumer_id":"digest","cursor":1}"#), "{stdout}\n{stderr}");
}

/// The book's tour (`docs/tour.md`), run as written against a server with
/// its defaults (embedded store, no authentication, on loopback): its
/// commands in one shell, in order, in a directory with the repository's
/// `registry/`. Only addresses change (`localhost:8080` and the source
/// `http://source:8080` to the server's port, which `TIDINGS_URL` gives
/// the CLI). A command that follows forever is stopped after 3 s, as a
/// reader would with Ctrl-C (`curl` by its `--max-time`, `tidings` by
/// SIGTERM to its PID: a background job of a script ignores SIGINT); any other failure is printed and fails the test.
/// Each answer the tour shows is in what the shell printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_book_tour_runs_as_written() {
    let blocks = shell_blocks("docs/tour.md", "# A tour", "`/openapi.json`");
    assert!(blocks.len() >= 3, "the tour has its commands: {blocks:?}");
    let dir = tempfile::tempdir().unwrap();
    let server = crate::helpers::spawn_process(&[("TIDINGS_DATA_DIR", dir.path().join("data").display().to_string())]).await;
    let address = server.base.trim_start_matches("http://").to_owned();
    let script = blocks.join("\n").replace("localhost:8080", &address).replace("http://source:8080", &server.base);
    let expected = answers(&script);
    assert!(expected.len() >= 2, "the tour shows its answers: {expected:?}");
    let registry = Path::new(ROOT).join("registry");
    let copied = std::process::Command::new("cp").arg("-r").arg(&registry).arg(dir.path()).status().unwrap();
    assert!(copied.success(), "copying the registry");
    let prelude = "failed() { echo \"tour-failed: $*\" >&2; }\n\
        curl() { command curl --max-time 3 \"$@\"; rc=$?; [ $rc -eq 0 ] || [ $rc -eq 28 ] || failed \"curl $* ($rc)\"; }\n\
        tidings() { command tidings \"$@\" & local pid=$!; ( sleep 3; kill $pid ) >/dev/null 2>&1 & local timer=$!; \
            wait $pid; local rc=$?; kill $timer 2>/dev/null; [ $rc -eq 0 ] || [ $rc -eq 143 ] || failed \"tidings $* ($rc)\"; }\n";
    let envs = [("TIDINGS_URL", server.base.clone())];
    let (stdout, stderr) = run_shell(&format!("{prelude}{script}\n"), dir.path(), &envs, std::time::Duration::from_secs(120)).await;
    assert!(!stderr.contains("tour-failed"), "a command of the tour failed:\n{stdout}\n{stderr}");
    for answer in &expected {
        assert!(stdout.contains(answer.as_str()), "the tour's answer {answer:?} is not in what it printed:\n{stdout}\n{stderr}");
    }
    // The streams showed the events, from the beginning and after id 2;
    // the CLI published the fourth and its JSON tail printed it.
    assert!(stdout.contains("id: 1\n") && stdout.contains("id: 3\n"), "{stdout}\n{stderr}");
    assert!(stdout.contains(r#""event_id":4,"event_type":"hypothesis.created""#), "{stdout}\n{stderr}");
    // The registry checked, and the path subscription was taken.
    assert!(stdout.contains("./registry: ") && stdout.contains("all valid"), "{stdout}\n{stderr}");
    assert!(stderr.contains("subscribed at sha256:"), "{stdout}\n{stderr}");
}

/// Nothing in the repository's code, docs, tests or deploy files cites a
/// document a user does not have: the specifications tidings was built
/// from are described in the book (`docs/ref-*.md`), and cited there.
#[test]
fn nothing_cites_a_document_outside_the_repository() {
    // Built from pieces, so that this file does not match itself.
    let outside =
        regex::Regex::new(&format!(r"(?i)\b{}\s*0\d\d\b|\b{}-0\d+|/work/{}|\b{}/\d{{3}}_", "seed", "spec", "shared", "seeds")).unwrap();
    let mut found = Vec::new();
    let mut stack: Vec<PathBuf> = ["crates", "src", "tests/api", "clients", "docs", "deploy", "scripts", "registry", "examples", ".ci"]
        .iter()
        .map(|d| Path::new(ROOT).join(d))
        .chain(["README.md", "Cargo.toml"].iter().map(|f| Path::new(ROOT).join(f)))
        .collect();
    while let Some(path) = stack.pop() {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if path.is_dir() {
            if !matches!(name, "node_modules" | "target" | ".mypy_cache" | "__pycache__") && !name.ends_with(".egg-info") {
                stack.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            }
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else { continue };
        for (n, line) in text.lines().enumerate() {
            if outside.is_match(line) {
                found.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(found.is_empty(), "citations of documents outside the repository:\n{}", found.join("\n"));
}

/// The generated part of `docs/<chapter>` ([`crate::helpers::generated_in`]).
fn generated_in(chapter: &str, begin: &str, end: &str, generated: &str) {
    crate::helpers::generated_in(&format!("docs/{chapter}"), begin, end, generated);
}

/// The settings table of docs/settings.md is the one the settings'
/// definitions make (`config::settings_table`).
#[test]
fn the_settings_table_is_generated_from_the_code() {
    generated_in(
        "settings.md",
        "<!-- generated from crates/server/src/config/",
        "<!-- end of the generated settings -->",
        &tidings_server::config::settings_table(),
    );
}

/// The metrics table of docs/metrics.md is the one the catalog makes
/// (`metrics::metrics_table`), and the catalog is what `/metrics` describes.
#[test]
fn the_metrics_table_is_generated_from_the_catalog() {
    generated_in(
        "metrics.md",
        "<!-- generated from crates/server/src/metrics.rs",
        "<!-- end of the generated metrics -->",
        &tidings_server::metrics::metrics_table(),
    );
}

/// The error-code table of docs/ref-errors.md is the one `/openapi.json`
/// makes: the codes each operation's annotation lists with its status,
/// and those any request may get (the document's description).
/// `tests/api/openapi.rs` holds the document to every code the source can
/// answer, and schemathesis holds the server to the statuses it lists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_error_code_table_is_generated_from_the_api_document() {
    let app = crate::helpers::spawn_app(crate::helpers::Backend::Embedded).await;
    let doc: serde_json::Value = app.http.get(app.url("/openapi.json")).send().await.unwrap().json().await.unwrap();
    generated_in("ref-errors.md", "<!-- generated from /openapi.json", "<!-- end of the generated error codes -->", &error_table(&doc));
}

/// One row per code: its statuses, where it is answered, and what the
/// document says of it (what a parenthesis right after the code holds, or
/// the text a colon after it opens). The codes any request may get come
/// first, so that their general meaning is the one shown.
fn error_table(doc: &serde_json::Value) -> String {
    use std::collections::{BTreeMap, BTreeSet};
    #[derive(Default)]
    struct Row {
        statuses: BTreeSet<String>,
        at: BTreeSet<String>,
        meaning: Option<String>,
    }
    let code = regex::Regex::new(r"`([a-z][a-z0-9_]*)`").unwrap();
    let mut rows: BTreeMap<String, Row> = BTreeMap::new();
    let mut take = |description: &str, status: &str, at: &str| {
        // The codes a description lists: the backticked names outside any
        // parenthesis and outside what a colon opens (a name there is a
        // field or a setting the text speaks of).
        let (mut depth, mut said, mut scanned) = (0, false, 0);
        let mut listed = Vec::new();
        for m in code.captures_iter(description).map(|c| c.get(0).unwrap()) {
            let before = &description[scanned..m.start()];
            scanned = m.end();
            for c in before.chars() {
                depth += i32::from(c == '(') - i32::from(c == ')');
                said |= depth == 0 && c == ':';
            }
            // A colon opens what a code means; "; `code`" lists again.
            said &= !(depth == 0 && before.trim_end().ends_with(';'));
            if depth == 0 && !said {
                listed.push((m.start(), m.end()));
            }
        }
        for (i, (start, end)) in listed.iter().enumerate() {
            let name = &description[start + 1..end - 1];
            let until = listed.get(i + 1).map_or(description.len(), |(next, _)| *next);
            let after = description[*end..until].trim().trim_end_matches([',', ';']).trim();
            let row = rows.entry(name.to_owned()).or_default();
            row.statuses.insert(status.to_owned());
            row.at.insert(at.to_owned());
            if row.meaning.is_some() {
                continue;
            }
            if let Some(said) = after.strip_prefix(':') {
                row.meaning = Some(said.trim().to_owned());
            } else if after.starts_with('(') {
                let mut depth = 0;
                let close = after.char_indices().find_map(|(i, c)| {
                    depth += i32::from(c == '(') - i32::from(c == ')');
                    (depth == 0).then_some(i)
                });
                row.meaning = close.map(|i| after[1..i].to_owned());
            }
        }
    };
    // The codes any request may get, from the document's description:
    // "... answers 404 `not_found`, ... 405 `method_not_allowed`, ...".
    let any = regex::Regex::new(r"(\d{3}) (`[a-z_]+`(?: \([^)]*\))?)").unwrap();
    for c in any.captures_iter(doc["info"]["description"].as_str().unwrap()) {
        take(&c[2], &c[1], "any request");
    }
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            for (status, response) in operation["responses"].as_object().into_iter().flatten() {
                if status.starts_with('4') || status.starts_with('5') {
                    take(response["description"].as_str().unwrap_or(""), status, &format!("`{} {path}`", method.to_uppercase()));
                }
            }
        }
    }
    let mut table = String::from("| Code | Status | Answered by | Notes |\n|---|---|---|---|\n");
    for (name, row) in rows {
        let statuses: Vec<_> = row.statuses.into_iter().collect();
        let at: Vec<_> = row.at.into_iter().collect();
        let at = if at.len() > 6 { format!("{} operations", at.len()) } else { at.join(", ") };
        let meaning = row.meaning.unwrap_or_default().replace('|', "\\|");
        table.push_str(&format!("| `{name}` | {} | {at} | {meaning} |\n", statuses.join(", ")));
    }
    table
}

/// Every alert `deploy/prometheus/alerts.yml` ships is described in the
/// book (docs/metrics.md, "Alerts"), and the book describes no other.
#[test]
fn every_shipped_alert_is_in_the_book() {
    let rules = std::fs::read_to_string(Path::new(ROOT).join("deploy/prometheus/alerts.yml")).unwrap();
    let shipped: Vec<&str> = rules.lines().filter_map(|l| l.trim().strip_prefix("- alert: ")).collect();
    assert!(shipped.len() >= 5, "{shipped:?}");
    let chapter = std::fs::read_to_string(Path::new(ROOT).join("docs/metrics.md")).unwrap();
    let (_, section) = chapter.split_once("## Alerts").expect("docs/metrics.md has \"## Alerts\"");
    let described: Vec<&str> =
        section.lines().filter_map(|l| l.strip_prefix("| `")).filter_map(|l| l.split_once('`')).map(|(name, _)| name).collect();
    assert_eq!(described, shipped, "the Alerts table lists the shipped alerts, in their order");
}
