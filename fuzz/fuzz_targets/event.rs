//! Fuzzes the event decoder and validator: a publish body either fails to
//! decode, is refused by validation, or becomes a stored body that decodes
//! back into the same event and an envelope that is valid JSON.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidings_server::event::{Event, PublishRequest};

fuzz_target!(|data: &[u8]| {
    let Ok(request) = serde_json::from_slice::<PublishRequest>(data) else { return };
    let Ok(body) = request.into_body(64 * 1024, chrono::DateTime::UNIX_EPOCH) else { return };
    let json = body.to_json();
    let event = Event::from_stored(7, &json, 0).expect("a stored body decodes");
    assert_eq!(event.body, body);
    let envelope: serde_json::Value = serde_json::from_slice(&event.envelope).expect("the envelope is JSON");
    assert_eq!(envelope["event_id"], 7);
});
