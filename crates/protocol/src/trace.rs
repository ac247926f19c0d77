//! W3C trace context as tidings keeps it with an event (docs/tracing.md):
//! the `traceparent` and `tracestate` a publisher sent with it, checked
//! here and then stored and delivered as they came, so that whoever
//! receives the event can continue the publisher's trace.
//!
//! Only version `00` of `traceparent` is taken (the one version there is),
//! with trace and parent ids that are not all zeros; a `tracestate` is a
//! list of at most 32 `key=value` members in the W3C grammar, at most 512
//! bytes. Both are refused when malformed, rather than dropped: a
//! publisher learns at once that its context did not travel. A
//! well-formed `tracestate` without a `traceparent` means nothing and is
//! ignored, as the W3C recommendation says.

/// Longest `tracestate` kept, in bytes.
pub const MAX_TRACESTATE: usize = 512;
/// Most members of a `tracestate`.
pub const MAX_MEMBERS: usize = 32;

/// What a `traceparent` is, as a JSON Schema pattern: version `00`, a
/// trace id and a parent id of lowercase hex that are not all zeros, the
/// flags.
pub fn traceparent_pattern() -> String {
    // `n` hex digits, not all zeros: the first that is not 0 comes at i.
    let not_zero = |n: usize| (0..n).map(|i| format!("0{{{i}}}[1-9a-f][0-9a-f]{{{}}}", n - 1 - i)).collect::<Vec<_>>().join("|");
    format!("^00-(?:{})-(?:{})-[0-9a-f]{{2}}$", not_zero(32), not_zero(16))
}

/// What a `tracestate` is, as a JSON Schema pattern (with
/// [`MAX_TRACESTATE`] as its `maxLength`).
pub const TRACESTATE_PATTERN: &str = concat!(
    "^(?:[a-z][a-z0-9_*/-]{0,255}|[a-z0-9][a-z0-9_*/-]{0,240}@[a-z][a-z0-9_*/-]{0,13})=[ -+\\--<>-~]{0,255}[!-+\\--<>-~]",
    "(?:[ \\t]*,[ \\t]*(?:[a-z][a-z0-9_*/-]{0,255}|[a-z0-9][a-z0-9_*/-]{0,240}@[a-z][a-z0-9_*/-]{0,13})=[ -+\\--<>-~]{0,255}[!-+\\--<>-~]){0,31}$"
);

/// The trace context of one publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// `00-<trace id>-<parent id>-<flags>`.
    pub traceparent: String,
    /// The vendors' list, if one came.
    pub tracestate: Option<String>,
}

/// Why a trace context was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    /// `traceparent` is not `00-<32 hex>-<16 hex>-<2 hex>` (lowercase, ids
    /// not all zeros).
    #[error("traceparent must be 00-<32 lowercase hex>-<16 lowercase hex>-<2 lowercase hex>, with ids that are not all zeros")]
    Traceparent,
    /// `tracestate` breaks the W3C grammar or its bounds.
    #[error("tracestate must be 1 to 32 comma-separated key=value members of the W3C grammar, at most 512 bytes")]
    Tracestate,
}

impl TraceContext {
    /// The context of `traceparent` and `tracestate` as they came (`None`
    /// without a `traceparent`; a `tracestate` is checked all the same).
    pub fn parse(traceparent: Option<&str>, tracestate: Option<&str>) -> Result<Option<Self>, TraceError> {
        if tracestate.is_some_and(|state| !valid_tracestate(state)) {
            return Err(TraceError::Tracestate);
        }
        let Some(traceparent) = traceparent else { return Ok(None) };
        if !valid_traceparent(traceparent) {
            return Err(TraceError::Traceparent);
        }
        Ok(Some(Self { traceparent: traceparent.to_owned(), tracestate: tracestate.map(str::to_owned) }))
    }

    /// The trace id (32 lowercase hex).
    pub fn trace_id(&self) -> &str {
        &self.traceparent[3..35]
    }
}

fn lower_hex(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn valid_traceparent(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    let [version, trace, parent, flags] = parts[..] else { return false };
    version == "00"
        && trace.len() == 32
        && parent.len() == 16
        && flags.len() == 2
        && [trace, parent, flags].into_iter().all(lower_hex)
        && trace.bytes().any(|b| b != b'0')
        && parent.bytes().any(|b| b != b'0')
}

fn valid_tracestate(s: &str) -> bool {
    let members: Vec<&str> = s.split(',').collect();
    s.len() <= MAX_TRACESTATE
        && members.len() <= MAX_MEMBERS
        && members.iter().enumerate().all(|(i, m)| {
            // Optional spaces and tabs around each comma, none at the ends.
            let m = if i > 0 { m.trim_start_matches([' ', '\t']) } else { m };
            let m = if i + 1 < members.len() { m.trim_end_matches([' ', '\t']) } else { m };
            valid_member(m)
        })
}

fn valid_member(m: &str) -> bool {
    let Some((key, value)) = m.split_once('=') else { return false };
    valid_key(key) && valid_value(value)
}

fn key_char(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'-' | b'*' | b'/')
}

fn valid_key(key: &str) -> bool {
    let b = key.as_bytes();
    match key.split_once('@') {
        None => !b.is_empty() && b.len() <= 256 && b[0].is_ascii_lowercase() && b.iter().all(|c| key_char(*c)),
        Some((tenant, system)) => {
            let (t, s) = (tenant.as_bytes(), system.as_bytes());
            !t.is_empty()
                && t.len() <= 241
                && (t[0].is_ascii_lowercase() || t[0].is_ascii_digit())
                && t.iter().all(|c| key_char(*c))
                && !s.is_empty()
                && s.len() <= 14
                && s[0].is_ascii_lowercase()
                && s.iter().all(|c| key_char(*c))
        }
    }
}

fn valid_value(value: &str) -> bool {
    let nblk = |b: u8| (0x21..=0x7e).contains(&b) && b != b',' && b != b'=';
    let b = value.as_bytes();
    !b.is_empty() && b.len() <= 256 && b.iter().all(|c| *c == b' ' || nblk(*c)) && nblk(b[b.len() - 1])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn the_w3c_examples_are_taken_and_their_breakages_refused() {
        let ok = TraceContext::parse(Some(PARENT), Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")).unwrap().unwrap();
        assert_eq!(ok.trace_id(), "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(TraceContext::parse(None, Some("rojo=00f067aa0ba902b7")), Ok(None));
        assert_eq!(TraceContext::parse(None, Some("{}")), Err(TraceError::Tracestate));
        assert!(TraceContext::parse(Some(PARENT), Some("tenant@vendor=x ,\tb=1")).is_ok());
        for bad in [
            "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "",
        ] {
            assert_eq!(TraceContext::parse(Some(bad), None), Err(TraceError::Traceparent), "{bad:?}");
        }
        let many = (0..33).map(|i| format!("k{i}=v")).collect::<Vec<_>>().join(",");
        for bad in ["", "=v", "K=v", "k=", "k=v ", "k=a,b", "k=v,", " k=v", "k=v=w", many.as_str(), &format!("k={}", "v".repeat(600))] {
            assert_eq!(TraceContext::parse(Some(PARENT), Some(bad)), Err(TraceError::Tracestate), "{bad:?}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// What the published schema's pattern describes is what is taken.
        #[test]
        fn the_tracestate_pattern_and_the_parser_agree(s in "[a-z0-9@=, \t!-~]{0,40}") {
            let pattern = regex::Regex::new(TRACESTATE_PATTERN).unwrap();
            prop_assert_eq!(valid_tracestate(&s), pattern.is_match(&s) && s.len() <= MAX_TRACESTATE, "{:?}", s);
        }

        #[test]
        fn every_string_of_the_tracestate_pattern_is_taken(s in TRACESTATE_PATTERN.trim_start_matches('^').trim_end_matches('$')) {
            prop_assert_eq!(valid_tracestate(&s), s.len() <= MAX_TRACESTATE, "{:?}", s);
        }

        #[test]
        fn the_traceparent_pattern_and_the_parser_agree(s in "0[01]-[0A-F1-9a-f]{0,2}[0]{0,31}[0-9a-fA-F]{0,2}-0{0,15}[0-9a-f]{0,2}-[0-9a-f]{2}") {
            let pattern = regex::Regex::new(&traceparent_pattern()).unwrap();
            prop_assert_eq!(valid_traceparent(&s), pattern.is_match(&s), "{:?}", s);
        }

        #[test]
        fn every_string_of_the_traceparent_pattern_is_taken(s in traceparent_pattern().trim_start_matches('^').trim_end_matches('$')) {
            prop_assert!(valid_traceparent(&s), "{:?}", s);
        }
    }
}
