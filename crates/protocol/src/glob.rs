//! Segment globs over dotted names: `*` is exactly one segment, `**` is one or
//! more segments, anywhere in the pattern (`**.recorded`, `link.*.added`,
//! `hypothesis.**`).
//!
//! Why not `globset`: its `**` matches *zero* or more path components and only
//! knows `/` as a separator, while event types want one-or-more over `.`
//! (docs/streams.md); and the broker's index needs the literal prefix of a
//! pattern, which a compiled regex does not expose. Matching is a small
//! dynamic programme over segments (O(pattern × name) at worst,
//! allocation-free), checked against an independent regex translation by
//! property tests.

use std::fmt;

use crate::event::is_valid_segment;

/// Longest tree path, and so longest path pattern, in bytes (the tree
/// vocabulary uses the same bound).
pub const MAX_PATH_LEN: usize = 1024;

/// One segment of a compiled pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seg {
    Lit(Box<str>),
    One,
    OneOrMore,
}

/// A compiled event-type glob.
#[derive(Clone, PartialEq, Eq)]
pub struct Glob {
    source: Box<str>,
    segs: Box<[Seg]>,
    /// No wildcard: matching is a string comparison.
    literal: bool,
    /// `.` for event types, `/` for tree paths.
    sep: char,
}

impl fmt::Debug for Glob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Glob({})", self.source)
    }
}

/// Why a pattern is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GlobError {
    /// The pattern is empty.
    #[error("empty pattern")]
    Empty,
    /// A segment is empty (`a..b`, `.a`, `a.`).
    #[error("pattern {0:?} has an empty segment")]
    EmptySegment(String),
    /// A segment is neither a name segment nor `*`/`**`.
    #[error("pattern {pattern:?}: segment {segment:?} is not a lowercase snake_case name, '*' or '**'")]
    BadSegment {
        /// The whole pattern.
        pattern: String,
        /// The offending segment.
        segment: String,
    },
    /// The pattern is longer than any valid name could be.
    #[error("pattern is longer than {0} bytes")]
    TooLong(usize),
}

impl Glob {
    /// Compiles a pattern.
    pub fn new(pattern: &str) -> Result<Self, GlobError> {
        Self::compile(pattern, '.', crate::event::MAX_NAME_LEN, is_valid_segment)
    }

    /// Compiles a tree-path pattern: the same `*` / `**` segment rules over
    /// `/`, literal segments of `[A-Za-z0-9._~:-]` (capability resources,
    /// subscription patterns).
    pub fn new_path(pattern: &str) -> Result<Self, GlobError> {
        let valid = |s: &str| s != "." && s != ".." && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._~:-".contains(&b));
        Self::compile(pattern, '/', MAX_PATH_LEN, valid)
    }

    fn compile(pattern: &str, sep: char, max_len: usize, valid: impl Fn(&str) -> bool) -> Result<Self, GlobError> {
        if pattern.is_empty() {
            return Err(GlobError::Empty);
        }
        if pattern.len() > max_len {
            return Err(GlobError::TooLong(max_len));
        }
        let mut segs = Vec::new();
        for segment in pattern.split(sep) {
            let seg = match segment {
                "" => return Err(GlobError::EmptySegment(pattern.to_owned())),
                "*" => Seg::One,
                "**" => Seg::OneOrMore,
                s if valid(s) => Seg::Lit(s.into()),
                s => return Err(GlobError::BadSegment { pattern: pattern.to_owned(), segment: s.to_owned() }),
            };
            // `**.**` means the same as `*.**`; keep the pattern as written,
            // the matcher handles consecutive wildcards correctly.
            segs.push(seg);
        }
        let literal = segs.iter().all(|s| matches!(s, Seg::Lit(_)));
        Ok(Self { source: pattern.into(), segs: segs.into(), literal, sep })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// The name this pattern matches when it has no wildcard.
    pub fn exact(&self) -> Option<&str> {
        self.literal.then_some(&*self.source)
    }

    /// The leading literal segments (`link` for `link.*.added`), joined by
    /// `.`; `None` when the pattern starts with a wildcard.
    pub fn literal_prefix(&self) -> Option<&str> {
        let lits = self.segs.iter().take_while(|s| matches!(s, Seg::Lit(_))).count();
        if lits == 0 {
            return None;
        }
        let end = self.source.split(self.sep).take(lits).map(str::len).sum::<usize>() + lits - 1;
        Some(&self.source[..end])
    }

    /// Whether `name` matches.
    pub fn matches(&self, name: &str) -> bool {
        // Fast path: most patterns are exact names.
        if self.literal {
            return *self.source == *name;
        }
        // Segments of the name, without allocating: at most 64 are tracked
        // (names are at most 255 bytes, so at most 128 segments; longer ones
        // fall back to a Vec).
        let mut stack: [&str; 64] = [""; 64];
        let heap: Vec<&str>;
        let n = name.split(self.sep).count();
        let segments: &[&str] = if n <= stack.len() {
            for (slot, s) in stack.iter_mut().zip(name.split(self.sep)) {
                *slot = s;
            }
            &stack[..n]
        } else {
            heap = name.split(self.sep).collect();
            &heap
        };
        match_segments(&self.segs, segments)
    }
}

impl Glob {
    /// Whether every name `other` matches is matched by `self` too: a grant
    /// over resources covers a subscription pattern. Sound but not complete
    /// (when in doubt it answers `false`, which refuses): `*` covers a literal
    /// or `*`, `**` covers any run of one or more segments, a literal only
    /// itself.
    pub fn covers(&self, other: &Glob) -> bool {
        let (g, p) = (&self.segs, &other.segs);
        // dp[j]: the first i segments of `self` cover the first j of `other`.
        let mut dp = vec![false; p.len() + 1];
        dp[0] = true;
        for seg in g.iter() {
            let mut next = vec![false; p.len() + 1];
            for j in 1..=p.len() {
                next[j] = match seg {
                    Seg::Lit(a) => matches!(&p[j - 1], Seg::Lit(b) if a == b) && dp[j - 1],
                    Seg::One => !matches!(p[j - 1], Seg::OneOrMore) && dp[j - 1],
                    Seg::OneOrMore => dp[j - 1] || next[j - 1],
                };
            }
            dp = next;
        }
        dp[p.len()]
    }
}

/// `reach[j]`: the first `i` pattern segments can consume exactly the first
/// `j` name segments. One row at a time, so memory is O(name).
fn match_segments(pattern: &[Seg], name: &[&str]) -> bool {
    const MAX: usize = 130;
    let n = name.len();
    if n + 1 > MAX {
        return false;
    }
    let mut reach = [false; MAX];
    reach[0] = true;
    for seg in pattern {
        let mut next = [false; MAX];
        match seg {
            Seg::Lit(lit) => {
                for j in 0..n {
                    next[j + 1] = reach[j] && name[j] == &**lit;
                }
            }
            Seg::One => {
                next[1..=n].copy_from_slice(&reach[..n]);
            }
            Seg::OneOrMore => {
                // next[j] = exists k < j with reach[k]
                let mut any = false;
                for j in 1..=n {
                    any |= reach[j - 1];
                    next[j] = any;
                }
            }
        }
        reach = next;
    }
    reach[n]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, n: &str) -> bool {
        Glob::new(p).unwrap().matches(n)
    }

    #[test]
    fn spec_examples() {
        assert!(m("hypothesis.*", "hypothesis.created"));
        assert!(!m("hypothesis.*", "hypothesis.created.again"));
        assert!(!m("hypothesis.*", "hypothesis"));
        assert!(m("hypothesis.**", "hypothesis.created"));
        assert!(m("hypothesis.**", "hypothesis.a.b.c"));
        assert!(!m("hypothesis.**", "hypothesis"));
        assert!(m("**.recorded", "signal.upvote.recorded"));
        assert!(m("**.recorded", "a.recorded"));
        assert!(!m("**.recorded", "recorded"));
        assert!(m("link.*.added", "link.cites.added"));
        assert!(!m("link.*.added", "link.cites.removed"));
        assert!(!m("link.*.added", "link.a.b.added"));
        assert!(m("signal.upvote.recorded", "signal.upvote.recorded"));
        assert!(!m("signal.upvote.recorded", "signal.upvote"));
        assert!(m("a.**.z", "a.b.c.z"));
        assert!(!m("a.**.z", "a.z"));
        assert!(m("**", "anything.at.all"));
        assert!(m("*.*", "a.b"));
    }

    #[test]
    fn invalid_patterns() {
        assert_eq!(Glob::new(""), Err(GlobError::Empty));
        assert!(matches!(Glob::new("a..b"), Err(GlobError::EmptySegment(_))));
        assert!(matches!(Glob::new(".a"), Err(GlobError::EmptySegment(_))));
        assert!(matches!(Glob::new("a."), Err(GlobError::EmptySegment(_))));
        assert!(matches!(Glob::new("A.b"), Err(GlobError::BadSegment { .. })));
        assert!(matches!(Glob::new("a.b*"), Err(GlobError::BadSegment { .. })));
        assert!(matches!(Glob::new("a.***"), Err(GlobError::BadSegment { .. })));
        assert!(matches!(Glob::new("a/b"), Err(GlobError::BadSegment { .. })));
    }

    #[test]
    fn covering() {
        let c = |g: &str, p: &str| Glob::new_path(g).unwrap().covers(&Glob::new_path(p).unwrap());
        assert!(c("local/**", "local/files/*"));
        assert!(c("local/**", "local/**"));
        assert!(c("local/*", "local/a"));
        assert!(c("local/*", "local/*"));
        assert!(c("**", "a/b/**"));
        assert!(c("a/b", "a/b"));
        assert!(!c("local/*", "local/**"), "one segment does not cover many");
        assert!(!c("local/a", "local/*"));
        assert!(!c("local/**", "local"), "** needs at least one segment");
        assert!(!c("local/*/x", "local/**"));
        assert!(!c("a/b", "a/c"));
    }

    #[test]
    fn path_patterns() {
        let p = |pat: &str, path: &str| Glob::new_path(pat).unwrap().matches(path);
        assert!(p("sensors/**", "sensors/a/b"));
        assert!(!p("sensors/**", "sensors"));
        assert!(p("sensors/*/temp", "sensors/Kitchen-1/temp"));
        assert!(!p("sensors/*/temp", "sensors/a/b/temp"));
        assert!(p("system/inbox/file-watcher", "system/inbox/file-watcher"));
        assert!(Glob::new_path("a//b").is_err());
        assert!(Glob::new_path("a/../b").is_err());
        assert!(Glob::new_path("a.b/c").is_ok(), "dots are ordinary characters in paths");
    }

    #[test]
    fn prefixes() {
        assert_eq!(Glob::new("link.*.added").unwrap().literal_prefix(), Some("link"));
        assert_eq!(Glob::new("signal.upvote.*").unwrap().literal_prefix(), Some("signal.upvote"));
        assert_eq!(Glob::new("**.recorded").unwrap().literal_prefix(), None);
        assert_eq!(Glob::new("a.b").unwrap().exact(), Some("a.b"));
        assert_eq!(Glob::new("a.*").unwrap().exact(), None);
    }

    /// An independent reference: the pattern translated to a regex.
    fn reference(pattern: &str, name: &str) -> bool {
        let parts: Vec<String> = pattern
            .split('.')
            .map(|seg| match seg {
                "*" => "[a-z][a-z0-9_]*".to_owned(),
                "**" => "[a-z][a-z0-9_]*(?:\\.[a-z][a-z0-9_]*)*".to_owned(),
                lit => regex::escape(lit),
            })
            .collect();
        regex::Regex::new(&format!("^{}$", parts.join("\\."))).unwrap().is_match(name)
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        #[test]
        fn matches_the_regex_reference(
            pattern in proptest::collection::vec(proptest::prop_oneof!["a", "b", "ab", "\\*", "\\*\\*"], 1..5),
            name in proptest::collection::vec(proptest::prop_oneof!["a", "b", "ab"], 1..7),
        ) {
            let pattern = pattern.join(".");
            let name = name.join(".");
            proptest::prop_assert_eq!(Glob::new(&pattern).unwrap().matches(&name), reference(&pattern, &name), "{} vs {}", pattern, name);
        }
    }
}
