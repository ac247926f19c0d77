//! Embeds the shipped event-type registry (`registry/*.json` at the
//! workspace root) into the server,
//! so `tidings` runs with every registered type (docs/events.md) known even
//! when started outside the repository. A `TIDINGS_REGISTRY` directory, when
//! present, wins.

use std::{env, fs, path::Path};

fn main() {
    println!("cargo:rerun-if-changed=../../registry");
    let dir = Path::new(&env::var("CARGO_MANIFEST_DIR").unwrap()).join("../../registry");
    let mut files: Vec<_> = fs::read_dir(&dir)
        .map(|rd| rd.filter_map(Result::ok).map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "json")).collect())
        .unwrap_or_default();
    files.sort();
    let mut out = String::from(
        "/// The registry shipped in `registry/`, as (file name, contents).\npub(crate) const BUILTIN: &[(&str, &str)] = &[\n",
    );
    for f in files {
        out.push_str(&format!("    ({:?}, include_str!({:?})),\n", f.file_name().unwrap().to_string_lossy(), f.display().to_string()));
    }
    out.push_str("];\n");
    fs::write(Path::new(&env::var("OUT_DIR").unwrap()).join("builtin_registry.rs"), out).unwrap();
}
