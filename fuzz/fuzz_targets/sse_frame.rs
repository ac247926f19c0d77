//! Fuzzes the SSE frame encoder against the parser: any data without a line
//! break, under any event name without one, encodes to a frame that parses
//! back to exactly that id, name and data.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidings_client::sse::SseParser;
use tidings_server::http::sse_frame;

fuzz_target!(|input: (Option<i64>, Option<String>, String)| {
    let (id, name, data) = input;
    let clean = |s: &str| !s.contains(['\n', '\r']);
    if !clean(&data) || !name.as_deref().is_none_or(|n| clean(n) && !n.is_empty()) {
        return;
    }
    let frame = sse_frame(id, name.as_deref(), data.as_bytes());
    let mut parser = SseParser::default();
    let events = parser.feed(&frame);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].id, id.map(|i| i.to_string()));
    assert_eq!(events[0].event, name);
    // The encoder always writes one space after `data:`, so a leading space
    // of the data itself survives the parser's separator stripping.
    assert_eq!(events[0].data, data);
});
