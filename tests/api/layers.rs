//! The architecture holds: read from the source, the module graph has no
//! cycle (at the top level, nor among the children of any module), the service layer names no HTTP type, nothing below it imports it
//! (or the transports), and the transports leave replay to the session.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/crates/server/src");

/// Every `.rs` file below `dir`, with its text minus its unit tests.
fn sources(dir: &Path) -> Vec<(String, String)> {
    rust_files(dir)
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap().to_owned();
            (path.strip_prefix(SRC).unwrap().to_string_lossy().into_owned(), code)
        })
        .collect()
}

/// The top-level module a file belongs to (`service/poll.rs` -> `service`).
fn module_of(file: &str) -> String {
    file.split('/').next().unwrap().trim_end_matches(".rs").to_owned()
}

/// Top-level module -> the top-level modules it names through `crate::`.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let uses = regex::Regex::new(r"crate::([a-z_]+)").unwrap();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (file, code) in sources(Path::new(SRC)) {
        let module = module_of(&file);
        if module == "lib" || module == "main" {
            continue;
        }
        let deps = graph.entry(module.clone()).or_default();
        for c in uses.captures_iter(&code) {
            if c[1] != module {
                deps.insert(c[1].to_owned());
            }
        }
    }
    graph
}

/// Fails the test on the first cycle of `graph` (`what` names the level).
fn assert_acyclic(graph: &BTreeMap<String, BTreeSet<String>>, what: &str) {
    // Depth-first search with colours: grey on the stack, black done.
    fn visit<'a>(
        node: &'a str,
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        colour: &mut BTreeMap<&'a str, u8>,
        path: &mut Vec<&'a str>,
        what: &str,
    ) {
        colour.insert(node, 1);
        path.push(node);
        for next in graph.get(node).into_iter().flatten() {
            match colour.get(next.as_str()) {
                Some(1) => panic!("import cycle{what}: {} -> {next}", path.join(" -> ")),
                Some(_) => {}
                None if graph.contains_key(next) => visit(next, graph, colour, path, what),
                None => {}
            }
        }
        path.pop();
        colour.insert(node, 2);
    }
    let mut colour = BTreeMap::new();
    for node in graph.keys() {
        if !colour.contains_key(node.as_str()) {
            visit(node, graph, &mut colour, &mut Vec::new(), what);
        }
    }
}

#[test]
fn the_module_graph_has_no_cycle() {
    let graph = graph();
    assert_acyclic(&graph, "");
    assert!(graph.len() > 10, "the scan found the modules: {:?}", graph.keys());
}

/// A source file's module path: `federation/mirror/link.rs` is
/// `[federation, mirror, link]`, `federation/mirror/mod.rs` is
/// `[federation, mirror]`, `lib.rs` is `[]`.
fn module_path(file: &str) -> Vec<String> {
    let mut path: Vec<String> = file.trim_end_matches(".rs").split('/').map(str::to_owned).collect();
    if path.last().is_some_and(|last| last == "mod" || last == "lib" || last == "main") {
        path.pop();
    }
    path
}

/// For every module of the crate at `src` that has children, at any depth
/// (`""` is the crate itself, `"federation/mirror"` one of its
/// directories): which of its children names which sibling in code (not in
/// comments), through `crate::`, `self::` or `super::` paths, each resolved
/// to where it points. A child is a file or a directory (`store/postgres/
/// log.rs` belongs to `postgres` in `store`'s graph); the parent's own
/// items, in its `mod.rs`, are not a sibling, and a parent naming its
/// children is no edge.
fn child_graphs(src: &Path) -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let comments = regex::Regex::new(r"//[^\n]*").unwrap();
    let paths = regex::Regex::new(r"\b((?:super::)+|crate::|self::)((?:[a-z_][a-z0-9_]*::)*)(?:([a-z_][a-z0-9_]*)|\{([^}]*)\})").unwrap();
    let is_child = |dir: &[String], name: &str| {
        let at = dir.iter().fold(src.to_path_buf(), |p, d| p.join(d));
        at.join(format!("{name}.rs")).is_file() || at.join(name).is_dir()
    };
    let mut out: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for path in rust_files(src) {
        let file = path.strip_prefix(src).unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&path).unwrap();
        let code = comments.replace_all(text.split("#[cfg(test)]").next().unwrap(), "").into_owned();
        let here = module_path(&file);
        for c in paths.captures_iter(&code) {
            let prefix = &c[1];
            let mut base: Vec<String> = match prefix {
                "crate::" => Vec::new(),
                "self::" => here.clone(),
                _ => {
                    let up = prefix.matches("super::").count();
                    if up > here.len() {
                        continue;
                    }
                    here[..here.len() - up].to_vec()
                }
            };
            base.extend(c[2].split("::").filter(|s| !s.is_empty()).map(str::to_owned));
            let entries: Vec<String> = match (c.get(3), c.get(4)) {
                (Some(one), _) => vec![one.as_str().to_owned()],
                (None, Some(group)) => group
                    .as_str()
                    .split(',')
                    .filter_map(|e| e.trim().trim_start_matches('{').split("::").next().map(str::to_owned))
                    .filter(|e| !e.is_empty() && e.starts_with(|c: char| c.is_ascii_lowercase()))
                    .collect(),
                _ => Vec::new(),
            };
            for entry in entries {
                let mut target = base.clone();
                target.push(entry);
                let shared = here.iter().zip(&target).take_while(|(a, b)| a == b).count();
                if shared >= here.len() || shared >= target.len() {
                    continue;
                }
                let (dir, from, to) = (&here[..shared], &here[shared], &target[shared]);
                if from != to && is_child(dir, to) && is_child(dir, from) {
                    out.entry(dir.join("/")).or_default().entry(from.clone()).or_default().insert(to.clone());
                }
            }
        }
    }
    out
}

/// No cycle among the children of any module, at any depth, in any crate
/// of the workspace (a `Marker` the courier needs lives in a leaf, not in
/// the engine beside it; a mirror's link, applier and upstream client
/// do not lean on each other in a circle).
#[test]
fn no_module_has_a_cycle_among_its_children() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for krate in ["crates/protocol/src", "crates/server/src", "crates/client/src", "crates/cli/src"] {
        let all = child_graphs(&root.join(krate));
        if krate == "crates/server/src" {
            for dir in ["", "federation", "federation/mirror", "store", "store/postgres"] {
                assert!(all.contains_key(dir), "the scan found {dir:?}'s children: {:?}", all.keys());
            }
        }
        for (dir, graph) in &all {
            assert_acyclic(graph, &format!(" in {krate}/{dir}"));
        }
    }
}

#[test]
fn nothing_below_the_service_layer_imports_it_or_a_transport() {
    let graph = graph();
    // (event, glob, identity, peer, retry and tree are the protocol crate's,
    // which cannot name the server at all.)
    let below = ["auth", "broker", "filter", "metrics", "registry", "store", "federation"];
    for module in below {
        let deps = graph.get(module).unwrap_or_else(|| panic!("no module {module}"));
        for upper in ["service", "http", "server", "app"] {
            assert!(!deps.contains(upper), "{module} imports {upper}: {deps:?}");
        }
    }
    assert!(graph["service"].iter().all(|d| d != "http" && d != "server"), "the service layer imports a transport");
    // Federation is reached through the service layer, like the broker.
    for transport in ["http", "server"] {
        assert!(!graph[transport].contains("federation"), "{transport} calls federation past the service layer: {:?}", graph[transport]);
    }
    // And within the service layer only its entry names it (the handle in
    // `service/mod.rs`, `POST /v1/execute` in `service/execute.rs`): the
    // path publish → store → broker → session, and the tree's writes (whose
    // rules on entities the composition root hands over), read without it.
    let mut naming: Vec<String> = sources(Path::new(SRC))
        .into_iter()
        .filter(|(file, code)| file.starts_with("service/") && code.contains("crate::federation"))
        .map(|(file, _)| file)
        .collect();
    naming.sort();
    assert_eq!(naming, ["service/execute.rs", "service/mod.rs"], "service files that name federation");
}

/// The tools (the client, the CLI, the load generators) are clients of a
/// server, never part of it: the server crate depends on none of them, nor
/// on what only they need, so `cargo build -p tidings-server` compiles none
/// of their code.
#[test]
fn the_server_crate_depends_on_no_tool() {
    let manifest = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/crates/server/Cargo.toml")).unwrap();
    let deps = manifest.split("[dependencies]").nth(1).unwrap().split("\n[").next().unwrap();
    assert!(deps.contains("tokio.workspace"), "the scan read the dependencies: {deps}");
    for tool in ["tidings-client", "tidings-cli", "indicatif", "\"connect\""] {
        assert!(!deps.contains(tool), "the server crate depends on {tool}");
    }
    let names_a_tool = regex::Regex::new(r"\b(tidings_client|tidings_cli|crate::tools)::").unwrap();
    for (file, code) in sources(Path::new(SRC)) {
        assert!(!names_a_tool.is_match(&code), "{file} names a tool crate");
    }
}

/// The crate's `[dependencies]` section.
fn dependencies(krate: &str) -> String {
    let manifest = std::fs::read_to_string(format!("{}/crates/{krate}/Cargo.toml", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let deps = manifest.split("[dependencies]").nth(1).unwrap().split("\n[").next().unwrap().to_owned();
    assert!(deps.contains("serde_json.workspace"), "the scan read {krate}'s dependencies: {deps}");
    deps
}

/// What servers and clients agree on is one crate that depends on no other
/// tidings crate, and the Rust client is built on it alone: a client
/// compiles no server code, and cannot drift from the server's protocol.
#[test]
fn the_client_is_built_on_the_protocol_alone() {
    let protocol = dependencies("protocol");
    assert!(!protocol.contains("tidings-"), "the protocol crate depends on another tidings crate: {protocol}");
    let client = dependencies("client");
    assert!(client.contains("tidings-protocol.workspace"), "the client reads the protocol crate");
    for other in ["tidings-server", "tidings-cli"] {
        assert!(!client.contains(other), "the client depends on {other}");
    }
    let names = regex::Regex::new(r"\b(tidings_server|tidings_cli)::").unwrap();
    let protocol_or_client: Vec<String> = workspace_sources()
        .into_iter()
        .filter(|(file, code)| (file.starts_with("protocol/") || file.starts_with("client/")) && names.is_match(code))
        .map(|(file, _)| file)
        .collect();
    assert!(protocol_or_client.is_empty(), "these name the server or the CLI: {protocol_or_client:?}");
}

/// The protocol crate is the wire contract and does no I/O beyond a retry's
/// sleep: it depends on no HTTP client, resolver or logging, and the server
/// names it where it uses it (no re-export under local names). Calling
/// peers is the outbound crate's, on the protocol alone.
#[test]
fn the_protocol_crate_is_the_wire_contract_alone() {
    let protocol = dependencies("protocol");
    for io in ["reqwest", "hyper", "ipnet", "url.", "tracing", "anyhow"] {
        assert!(!protocol.contains(&format!("\n{io}")), "the protocol crate depends on {io}: {protocol}");
    }
    let outbound = dependencies("outbound");
    assert!(outbound.contains("tidings-protocol.workspace") && !outbound.contains("tidings-server"), "{outbound}");
    let lib = std::fs::read_to_string(Path::new(SRC).join("lib.rs")).unwrap();
    assert!(!lib.contains("pub use tidings_protocol"), "the server re-exports the protocol crate under local names");
}

/// The top level is the layout the project was specified with
/// (`Cargo.toml`, `src`, `migrations`, `registry`, `tests`, `deploy`,
/// `README.md`): the schema lives in `migrations/`, one place for both
/// stores, and the server crate embeds it from there.
#[test]
fn the_top_level_is_the_specified_layout() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for top in ["Cargo.toml", "src", "migrations", "registry", "tests", "deploy", "README.md"] {
        assert!(root.join(top).exists(), "{top} is not at the top level");
    }
    assert!(!root.join("crates/server/migrations").exists(), "a second home for the schema");
    for (store, file) in [("postgres", "store/postgres/migrate.rs"), ("embedded", "store/embedded/mod.rs")] {
        let applied = std::fs::read_dir(root.join("migrations").join(store)).unwrap().count();
        let code = std::fs::read_to_string(Path::new(SRC).join(file)).unwrap();
        let embedded = code.matches(&format!("\"../../../../../migrations/{store}/")).count();
        assert!(applied > 10 && embedded == applied, "{store}: {applied} files, {embedded} embedded from the top level");
    }
}

/// Every `.rs` file of the workspace's crates, with its text minus its unit
/// tests and comments.
fn workspace_sources() -> Vec<(String, String)> {
    let comments = regex::Regex::new(r"//[^\n]*").unwrap();
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/crates"));
    let mut out = Vec::new();
    for krate in ["protocol", "server", "client", "cli"] {
        let src = root.join(krate).join("src");
        for path in rust_files(&src) {
            let text = std::fs::read_to_string(&path).unwrap();
            let code = comments.replace_all(text.split("#[cfg(test)]").next().unwrap(), "").into_owned();
            out.push((path.strip_prefix(root).unwrap().to_string_lossy().into_owned(), code));
        }
    }
    out
}

pub(crate) fn rust_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

/// Errors are typed at every boundary: a `Result<_, String>` is left only
/// where a setting is parsed from the command line or the environment
/// (clap's value parsers take one).
#[test]
fn no_error_is_a_bare_string_outside_setting_parsers() {
    let stringly = regex::Regex::new(r"Result<[^;{]*,\s*String>").unwrap();
    let parser = regex::Regex::new(r"fn (parse|parse_setting|from_str)\b").unwrap();
    let files = workspace_sources();
    assert!(files.len() > 80, "the scan read the workspace: {}", files.len());
    let mut offenders = Vec::new();
    for (file, code) in &files {
        if file == "server/src/config/values.rs" {
            continue;
        }
        for line in code.lines().filter(|l| stringly.is_match(l) && !parser.is_match(l)) {
            offenders.push(format!("{file}: {}", line.trim()));
        }
    }
    assert!(offenders.is_empty(), "errors as bare strings: {offenders:#?}");
}

/// The subscription engine starts nothing: the supervisor starts the
/// courier and the mirrors beside it while this process leads, so neither
/// is the engine's to keep, and the engine talks to them only through the
/// channels it publishes. (That it spawns no task, the compiler holds:
/// `tokio::spawn` is disallowed in crates/server/clippy.toml except where
/// a module expects it, saying why, and the engine expects it nowhere.)
#[test]
fn the_supervisor_starts_the_engines_siblings() {
    let starts = regex::Regex::new(r"\b(Courier::new|Mirrors::new)\b").unwrap();
    let sources = workspace_sources();
    let engine: Vec<&String> = sources
        .iter()
        .filter(|(file, code)| file.starts_with("server/src/federation/engine/") && starts.is_match(code))
        .map(|(file, _)| file)
        .collect();
    assert!(engine.is_empty(), "the engine starts the courier or the mirrors: {engine:?}");
    let (_, supervisor) = sources.iter().find(|(file, _)| file == "server/src/federation/supervisor.rs").expect("the supervisor");
    for sibling in ["Courier::new", "Mirrors::new"] {
        assert!(supervisor.contains(sibling), "the supervisor starts {sibling}");
    }
}

/// The boundaries clippy holds in the server crate (`scripts/test` runs
/// `cargo clippy --workspace --all-targets -- -D warnings`): metrics only
/// through the catalog, tasks only where their owner says why, and no HTTP
/// type below the transports.
#[test]
fn clippy_holds_the_server_crates_boundaries() {
    let config = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/server/clippy.toml")).unwrap();
    for path in [
        "metrics::counter",
        "metrics::gauge",
        "metrics::histogram",
        "tokio::spawn",
        "tokio::task::spawn",
        "http::StatusCode",
        "http::HeaderMap",
    ] {
        assert!(config.contains(&format!("path = \"{path}\"")), "clippy.toml no longer disallows {path}");
    }
    let test = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/test")).unwrap();
    assert!(test.contains("cargo clippy --workspace --all-targets --locked --quiet -- -D warnings"), "scripts/test runs clippy");
    assert!(test.contains("cargo fmt --all --check"), "scripts/test checks formatting");
}

/// No source file of the workspace (its crates, the binary, the tests) is
/// over 700 lines: past that a file does more than one thing.
#[test]
fn no_source_file_is_over_700_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in
        ["crates/protocol/src", "crates/server/src", "crates/server/benches", "crates/client/src", "crates/cli/src", "src", "tests/api"]
    {
        files.extend(rust_files(&root.join(dir)));
    }
    assert!(files.len() > 120, "the scan read the workspace: {}", files.len());
    let long: Vec<String> = files
        .iter()
        .map(|f| (f.strip_prefix(root).unwrap().display().to_string(), std::fs::read_to_string(f).unwrap().lines().count()))
        .filter(|(_, lines)| *lines > 700)
        .map(|(f, lines)| format!("{f}: {lines}"))
        .collect();
    assert!(long.is_empty(), "files over 700 lines: {long:?}");
}

#[test]
fn transports_leave_replay_to_the_session() {
    for file in ["http/sse.rs", "http/poll.rs"] {
        let text = std::fs::read_to_string(Path::new(SRC).join(file)).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap();
        for replay in ["read_after", "from_stored", ".subscribe("] {
            assert!(!code.contains(replay), "{file} reads the log itself ({replay})");
        }
        assert!(code.contains("crate::service"), "{file} goes through the service layer");
    }
}
