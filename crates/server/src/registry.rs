//! The event-type registry (docs/events.md): every known type, its payload
//! JSON Schema and its `renamed_from` aliases, loaded from `registry/`
//! (one `<type>.json` file per type) or, when that directory is absent, from
//! the copy embedded in the binary at build time. Pure after loading.
//!
//! A rename keeps both names firing: a type `b.new` with
//! `"renamed_from": ["a.old"]` makes a publish of either name append the
//! event under both, so subscribers of the old name keep working during the
//! deprecation period.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use tidings_protocol::event::is_valid_event_name;

mod builtin {
    include!(concat!(env!("OUT_DIR"), "/builtin_registry.rs"));
}

/// What to do with unregistered types and schema violations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum RegistryMode {
    /// Refuse them (`422`).
    Strict,
    /// Accept them, log and count.
    Warn,
}

/// One registry file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TypeDoc {
    /// The type name.
    pub name: String,
    /// What the event means.
    pub description: String,
    /// Former names that still fire.
    #[serde(default)]
    pub renamed_from: Vec<String>,
    /// JSON Schema of the payload.
    pub payload_schema: Value,
}

struct Entry {
    /// The canonical type this name belongs to.
    canonical: String,
    validator: jsonschema::Validator,
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry").field("canonical", &self.canonical).finish_non_exhaustive()
    }
}

/// What [`Registry::first_warning`] answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Warning {
    /// The first event of its type: log it.
    First,
    /// Logged before: count it only.
    Again,
    /// Too many types to name each: say so once, count the rest.
    Full,
}

/// The loaded registry.
#[derive(Debug)]
pub struct Registry {
    docs: BTreeMap<String, TypeDoc>,
    /// Every name (canonical and alias) to its entry.
    names: BTreeMap<String, Entry>,
    mode: RegistryMode,
    /// Where it was read from, as start-up says it.
    source: String,
    /// The types already warned of in warn mode (each is logged once; the
    /// metric counts every event), bounded: publishers choose the names.
    warned: std::sync::Mutex<std::collections::HashSet<String>>,
}

/// Types warned of by name, at most; past it, one line says the rest are
/// counted only.
const MAX_WARNED: usize = 1024;

/// Why the registry cannot be loaded.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// A file cannot be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A file is not a valid type document.
    #[error("{file}: {message}")]
    Invalid {
        /// The file.
        file: String,
        /// What is wrong.
        message: String,
    },
}

/// What is wrong with a publish, by the registry.
#[derive(Debug, PartialEq, Eq)]
pub enum Problem {
    /// The name is not registered.
    Unregistered,
    /// The payload breaks the type's schema.
    SchemaViolation(String),
}

/// The registry's verdict on one publish.
#[derive(Debug, PartialEq, Eq)]
pub struct Check {
    /// Names to append the event under: the published one first, then rename
    /// aliases.
    pub fire: Vec<String>,
    /// What is wrong, if anything; strict mode refuses, warn mode counts.
    pub problem: Option<Problem>,
}

impl Registry {
    /// Loads `dir`, or the embedded registry when `dir` does not exist.
    pub fn load(dir: &Path, mode: RegistryMode) -> Result<Self, RegistryError> {
        let source = if dir.is_dir() {
            format!("directory {}", dir.display())
        } else {
            "built into the binary (the project's registry/ directory when it was built)".to_owned()
        };
        let files = if dir.is_dir() {
            let mut files = Vec::new();
            let entries = std::fs::read_dir(dir).map_err(|source| RegistryError::Io { path: dir.display().to_string(), source })?;
            for entry in entries {
                let path = entry.map_err(|source| RegistryError::Io { path: dir.display().to_string(), source })?.path();
                if path.extension().is_some_and(|e| e == "json") {
                    let text =
                        std::fs::read_to_string(&path).map_err(|source| RegistryError::Io { path: path.display().to_string(), source })?;
                    files.push((path.file_name().unwrap_or_default().to_string_lossy().into_owned(), text));
                }
            }
            files
        } else {
            tracing::info!(dir = %dir.display(), "registry directory not found; using the registry built into the binary");
            builtin::BUILTIN.iter().map(|(n, t)| ((*n).to_owned(), (*t).to_owned())).collect()
        };
        let mut registry = Self::from_files(files, mode)?;
        registry.source = source;
        Ok(registry)
    }

    /// Where the registry was read from: a directory, or the copy built
    /// into the binary.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether an event of `event_type` the registry does not vouch for is
    /// the first of its type (log it), or one more (count it only). Past
    /// [`MAX_WARNED`] types, the first call says so once and the rest are
    /// counted only.
    pub fn first_warning(&self, event_type: &str) -> Warning {
        let mut warned = self.warned.lock().unwrap_or_else(|p| p.into_inner());
        if warned.contains(event_type) {
            return Warning::Again;
        }
        match warned.len() {
            n if n < MAX_WARNED => {
                warned.insert(event_type.to_owned());
                Warning::First
            }
            MAX_WARNED => {
                // A sentinel no event type can be (names are lowercase).
                warned.insert("!full".to_owned());
                Warning::Full
            }
            _ => Warning::Again,
        }
    }

    /// Builds a registry from `(file name, contents)` pairs.
    pub fn from_files(files: Vec<(String, String)>, mode: RegistryMode) -> Result<Self, RegistryError> {
        let mut docs = BTreeMap::new();
        let mut names = BTreeMap::new();
        for (file, text) in files {
            let invalid = |message: String| RegistryError::Invalid { file: file.clone(), message };
            let doc: TypeDoc = serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
            if file != format!("{}.json", doc.name) {
                return Err(invalid(format!("the file for type {:?} must be named {}.json", doc.name, doc.name)));
            }
            for name in std::iter::once(&doc.name).chain(&doc.renamed_from) {
                if !is_valid_event_name(name) {
                    return Err(invalid(format!("{name:?} is not a valid event name")));
                }
                let validator = jsonschema::validator_for(&doc.payload_schema).map_err(|e| invalid(format!("payload_schema: {e}")))?;
                if names.insert(name.clone(), Entry { canonical: doc.name.clone(), validator }).is_some() {
                    return Err(invalid(format!("{name:?} is registered twice")));
                }
            }
            docs.insert(doc.name.clone(), doc);
        }
        Ok(Self { docs, names, mode, source: "given files".to_owned(), warned: Default::default() })
    }

    /// The configured mode.
    pub fn mode(&self) -> RegistryMode {
        self.mode
    }

    /// Number of registered (canonical) types.
    pub fn len(&self) -> usize {
        self.docs.len()
    }

    /// Whether nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.docs.is_empty()
    }

    /// Whether `name` is registered (canonical or alias).
    pub fn contains(&self, name: &str) -> bool {
        self.names.contains_key(name)
    }

    /// Every type document, by name.
    pub fn docs(&self) -> impl Iterator<Item = &TypeDoc> {
        self.docs.values()
    }

    /// Checks a publish of `name` with `payload`.
    pub fn check(&self, name: &str, payload: &Value) -> Check {
        let Some(entry) = self.names.get(name) else {
            return Check { fire: vec![name.to_owned()], problem: Some(Problem::Unregistered) };
        };
        let doc = &self.docs[&entry.canonical];
        let mut fire = vec![name.to_owned()];
        fire.extend(std::iter::once(&doc.name).chain(&doc.renamed_from).filter(|n| *n != name).cloned());
        let problem = entry
            .validator
            .validate(payload)
            .err()
            .map(|e| Problem::SchemaViolation(format!("{e} (at {:?})", e.instance_path.to_string())));
        Check { fire, problem }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn builtin_registry_loads_and_knows_the_spec_types() {
        let r = Registry::load(Path::new("/nonexistent"), RegistryMode::Strict).unwrap();
        assert_eq!(r.len(), 33);
        for t in ["hypothesis.created", "signal.upvote.recorded", "link.contradicts.added", "system.replay_gap"] {
            assert!(r.contains(t), "{t}");
        }
        use tidings_protocol::event::names;
        for name in [
            names::SYSTEM_CLIENT_DROPPED_SLOW,
            names::SYSTEM_REPLAY_GAP,
            names::SYSTEM_TOKEN_EXPIRED,
            names::TREE_CREATED,
            names::TREE_UPDATED,
            names::TREE_DELETED,
        ] {
            assert!(r.contains(name), "{name} must be registered");
        }
    }

    #[test]
    fn renames_fire_both_names_and_schemas_apply() {
        let doc = json!({"name":"b.new","description":"d","renamed_from":["a.old"],"payload_schema":{"type":"object","required":["x"]}});
        let r = Registry::from_files(vec![("b.new.json".into(), doc.to_string())], RegistryMode::Strict).unwrap();
        assert_eq!(r.check("b.new", &json!({"x":1})), Check { fire: vec!["b.new".into(), "a.old".into()], problem: None });
        assert_eq!(r.check("a.old", &json!({"x":1})).fire, vec!["a.old".to_owned(), "b.new".to_owned()]);
        assert!(matches!(r.check("b.new", &json!({})).problem, Some(Problem::SchemaViolation(_))));
        assert_eq!(r.check("c.other", &json!({})).problem, Some(Problem::Unregistered));
    }
}
