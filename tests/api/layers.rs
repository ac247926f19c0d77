//! The architecture holds: read from the source, the module graph has no
//! cycle, the service layer names no HTTP type, nothing below it imports it
//! (or the transports), and the transports leave replay to the session.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src");

/// Every `.rs` file below `dir`, with its text minus its unit tests.
fn sources(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap().to_owned();
            out.push((path.strip_prefix(SRC).unwrap().to_string_lossy().into_owned(), code));
        }
    }
    out
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

#[test]
fn the_module_graph_has_no_cycle() {
    let graph = graph();
    // Depth-first search with colours: grey on the stack, black done.
    fn visit<'a>(
        node: &'a str,
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        colour: &mut BTreeMap<&'a str, u8>,
        path: &mut Vec<&'a str>,
    ) {
        colour.insert(node, 1);
        path.push(node);
        for next in graph.get(node).into_iter().flatten() {
            match colour.get(next.as_str()) {
                Some(1) => panic!("import cycle: {} -> {next}", path.join(" -> ")),
                Some(_) => {}
                None if graph.contains_key(next) => visit(next, graph, colour, path),
                None => {}
            }
        }
        path.pop();
        colour.insert(node, 2);
    }
    let mut colour = BTreeMap::new();
    for node in graph.keys() {
        if !colour.contains_key(node.as_str()) {
            visit(node, &graph, &mut colour, &mut Vec::new());
        }
    }
    assert!(graph.len() > 10, "the scan found the modules: {:?}", graph.keys());
}

#[test]
fn nothing_below_the_service_layer_imports_it_or_a_transport() {
    let graph = graph();
    let below = ["auth", "broker", "event", "filter", "glob", "identity", "metrics", "registry", "store", "subscription", "tree"];
    for module in below {
        let deps = graph.get(module).unwrap_or_else(|| panic!("no module {module}"));
        for upper in ["service", "http", "server", "app"] {
            assert!(!deps.contains(upper), "{module} imports {upper}: {deps:?}");
        }
    }
    assert!(graph["service"].iter().all(|d| d != "http" && d != "server"), "the service layer imports a transport");
    // The tools (load generator, CLI, SSE client) are clients of a server,
    // never part of it.
    for (module, deps) in &graph {
        if module != "tools" {
            assert!(!deps.contains("tools"), "{module} imports the tools tree");
        }
    }
}

#[test]
fn the_service_layer_names_no_http_type() {
    let files = sources(&Path::new(SRC).join("service"));
    assert!(files.len() >= 5);
    for (file, code) in files {
        for http in ["axum", "hyper", "http::", "StatusCode", "HeaderMap"] {
            assert!(!code.contains(http), "{file} names {http}");
        }
    }
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
