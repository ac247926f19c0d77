//! Fuzzes the filter parser and the JsonLogic validator/compiler: any input
//! is either refused with an error or compiles to a filter that can be
//! evaluated against an event without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidings_server::event::{EventBody, Visibility};
use tidings_server::filter::{Filter, FilterLimits};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(filter) = Filter::from_json(text, FilterLimits::default()) {
        let event = EventBody {
            event_type: "signal.upvote.recorded".into(),
            reference: Some("paper:p-1".into()),
            agent: None,
            session_id: None,
            occurred_at: "2026-01-01T00:00:00Z".into(),
            payload: serde_json::json!({"weight": 5, "tags": ["a", "b"], "nested": {"x": [1, 2, 3]}, "s": "text"}),
            links: vec![],
            visibility: Visibility::Public,
            traceparent: None,
            tracestate: None,
        };
        let _ = filter.matches(&event);
    }
});
