//! The WebSocket device protocol has one definition, the protocol crate's
//! `ws` module (its methods, JSON-RPC codes and close codes, and which of
//! them a client does not retry). The JavaScript and Python clients'
//! constants are generated from it into a marked block of each client
//! (`TIDINGS_BLESS=1 cargo test ws_protocol::` rewrites them), and each
//! client names a method only through those constants: a method or code
//! changed in Rust fails here until the clients follow.

use tidings_protocol::ws::{close, method, rpc};

const BEGIN_TS: &str = "// generated from crates/protocol/src/ws.rs";
const END_TS: &str = "// end of the generated protocol";
const BEGIN_PY: &str = "# generated from crates/protocol/src/ws.rs";
const END_PY: &str = "# end of the generated protocol";

/// The close codes after which a device does not reconnect, ascending.
fn refusing_closes() -> Vec<u16> {
    close::ALL.iter().map(|(_, code)| *code).filter(|code| !close::reconnects(*code)).collect()
}

/// The JSON-RPC codes a device does not retry, in the catalog's order.
fn final_rpc_errors() -> Vec<i64> {
    rpc::ALL.iter().map(|(_, code)| *code).filter(|code| rpc::is_final(*code)).collect()
}

fn joined<T: ToString>(values: &[T]) -> String {
    values.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

/// The TypeScript block.
fn typescript() -> String {
    let mut out = String::new();
    let object = |out: &mut String, name: &str, doc: &str, entries: Vec<(String, String)>| {
        out.push_str(&format!("/** {doc} */\nexport const {name} = {{\n"));
        for (key, value) in entries {
            out.push_str(&format!("  {key}: {value},\n"));
        }
        out.push_str("} as const;\n");
    };
    object(
        &mut out,
        "METHOD",
        "The device protocol's methods.",
        method::ALL.iter().map(|(k, v)| ((*k).to_owned(), format!("{v:?}"))).collect(),
    );
    object(
        &mut out,
        "RPC",
        "The JSON-RPC `error.code` of a refusal.",
        rpc::ALL.iter().map(|(k, v)| ((*k).to_owned(), v.to_string())).collect(),
    );
    object(&mut out, "CLOSE", "The close codes.", close::ALL.iter().map(|(k, v)| ((*k).to_owned(), v.to_string())).collect());
    out.push_str(&format!(
        "/** Close codes after which the same connection would be refused again: no reconnect. */\nexport const REFUSING_CLOSES: ReadonlySet<number> = new Set([{}]);\n",
        joined(&refusing_closes())
    ));
    out.push_str(&format!(
        "/** JSON-RPC errors the same request would meet again: final. Others are retried. */\nexport const FINAL_RPC_ERRORS: ReadonlySet<number> = new Set([{}]);\n",
        joined(&final_rpc_errors())
    ));
    out
}

/// The Python block.
fn python() -> String {
    let mut out = String::new();
    for (name, value) in method::ALL {
        out.push_str(&format!("METHOD_{name}: Final = {value:?}\n"));
    }
    for (name, value) in rpc::ALL {
        out.push_str(&format!("RPC_{name}: Final = {value}\n"));
    }
    for (name, value) in close::ALL {
        out.push_str(&format!("CLOSE_{name}: Final = {value}\n"));
    }
    out.push_str("#: Close codes after which the same connection would be refused again: no reconnect.\n");
    out.push_str(&format!("REFUSING_CLOSES: Final = frozenset({{{}}})\n", joined(&refusing_closes())));
    out.push_str("#: JSON-RPC errors the same request would meet again: final. Others are retried.\n");
    out.push_str(&format!("FINAL_RPC_ERRORS: Final = frozenset({{{}}})\n", joined(&final_rpc_errors())));
    out
}

const TS: &str = "clients/js/src/codes.ts";
/// The JavaScript client's modules, each checked for methods spelled by hand.
const TS_SOURCES: &str = "clients/js/src";
const PY_CORE: &str = "clients/python/src/tidings/_core.py";
const PY_CLIENTS: [&str; 2] = ["clients/python/src/tidings/_async/client.py", "clients/python/src/tidings/_sync/client.py"];

#[test]
fn the_clients_protocol_constants_are_generated_from_the_protocol_crate() {
    assert_eq!(refusing_closes(), [1002, 1003, 1007, 1008, 1009], "what the clients did before the catalog");
    crate::helpers::generated_in(TS, BEGIN_TS, END_TS, &typescript());
    crate::helpers::generated_in(PY_CORE, BEGIN_PY, END_PY, &python());
}

/// Outside the generated block no client spells a method by hand.
#[test]
fn no_client_spells_a_method_by_hand() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |path: &str| std::fs::read_to_string(root.join(path)).unwrap();
    let outside = |text: &str, begin: &str, end: &str| {
        let (head, rest) = text.split_once(begin).unwrap_or((text, ""));
        let tail = rest.split_once(end).map_or("", |(_, tail)| tail);
        format!("{head}{tail}")
    };
    let mut spelled = Vec::new();
    let mut check = |path: &str, code: String| {
        for (_, name) in method::ALL {
            for quoted in [format!("\"{name}\""), format!("'{name}'")] {
                if code.contains(&quoted) {
                    spelled.push(format!("{path}: {quoted}"));
                }
            }
        }
    };
    let mut modules: Vec<String> = std::fs::read_dir(root.join(TS_SOURCES))
        .unwrap()
        .map(|entry| format!("{TS_SOURCES}/{}", entry.unwrap().file_name().to_string_lossy()))
        .collect();
    modules.sort();
    assert!(modules.len() > 5, "the client's modules: {modules:?}");
    for path in &modules {
        let code = read(path);
        check(path, if path == TS { outside(&code, BEGIN_TS, END_TS) } else { code });
    }
    check(PY_CORE, outside(&read(PY_CORE), BEGIN_PY, END_PY));
    for path in PY_CLIENTS {
        check(path, read(path));
    }
    assert!(
        read("clients/js/src/device.ts").contains("METHOD.AUTH") && read(PY_CLIENTS[0]).contains("METHOD_AUTH"),
        "the clients use the constants"
    );
    assert!(spelled.is_empty(), "methods spelled by hand: {spelled:#?}");
}
