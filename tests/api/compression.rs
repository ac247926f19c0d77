//! Compressed streams (`TIDINGS_COMPRESSION=on`, docs/streams.md#compression):
//! a client that accepts gzip gets one gzip stream, each event inflating as
//! it arrives, built from segments compressed once per event and shared by
//! every stream (the same bytes whatever came before them), ended by a
//! trailer the decoder checks; a client that does not accept it, and every
//! client of a server with compression off, gets the plain stream; curl
//! reads it with `--compressed`. A WebSocket that offers
//! `permessage-deflate` gets it with no context takeover: its events
//! compressed once and shared, its own compressed messages inflated within
//! the message limit.

use std::io::{Read as _, Write as _};
use std::time::Duration;

use futures_util::StreamExt as _;
use serde_json::json;
use tokio::io::AsyncReadExt as _;

use tokio_tungstenite::tungstenite::protocol::frame::FrameHeader;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Control, Data, OpCode};

use crate::both_stores;
use crate::helpers::{Backend, TestApp, spawn_app, spawn_app_with};
use tidings_server::config::Compression;

both_stores!(
    a_gzip_stream_is_shared_segments_that_inflate_live_and_end_checked,
    curl_reads_a_compressed_stream,
    a_device_gets_shared_compressed_events_and_may_send_compressed
);

/// The raw body of one stream, and what it inflates to so far.
struct Raw {
    body: futures_util::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    raw: Vec<u8>,
    inflate: Option<flate2::write::GzDecoder<Vec<u8>>>,
}

impl Raw {
    /// Opens `/v1/stream{query}` with `accept` as its `Accept-Encoding`
    /// (reqwest is built without decompression: the body arrives as sent).
    async fn open(app: &TestApp, query: &str, accept: Option<&str>) -> (Self, reqwest::header::HeaderMap) {
        let mut request = app.http.get(app.url(&format!("/v1/stream{query}")));
        if let Some(accept) = accept {
            request = request.header("accept-encoding", accept);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 200);
        let headers = response.headers().clone();
        let gzip = headers.get("content-encoding").is_some_and(|v| v == "gzip");
        let raw = Raw {
            body: response.bytes_stream().boxed(),
            raw: Vec::new(),
            inflate: gzip.then(|| flate2::write::GzDecoder::new(Vec::new())),
        };
        (raw, headers)
    }

    /// The stream as text so far (inflated when compressed).
    fn text(&self) -> String {
        String::from_utf8_lossy(self.inflate.as_ref().map_or(&self.raw, |d| d.get_ref())).into_owned()
    }

    /// Reads until the text holds `needle`, within 10 s.
    async fn until(&mut self, needle: &str) {
        tokio::time::timeout(Duration::from_secs(10), async {
            while !self.text().contains(needle) {
                let chunk = self.body.next().await.expect("the stream goes on").unwrap();
                self.raw.extend_from_slice(&chunk);
                if let Some(inflate) = self.inflate.as_mut() {
                    inflate.write_all(&chunk).unwrap();
                    inflate.flush().unwrap();
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{needle:?} arrives; so far {:?}", self.text()));
    }

    /// Reads to the end of the body, within 10 s.
    async fn read_to_end(&mut self) {
        tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(chunk) = self.body.next().await {
                self.raw.extend_from_slice(&chunk.unwrap());
            }
        })
        .await
        .expect("the stream ends");
    }
}

/// A gzip body after its 10-byte header, cut into what the server wrote:
/// the stream's own chunks (stored blocks: `retry:`, heartbeats, notices)
/// and the events' compressed segments (each ends with the empty stored
/// block of its flush, `00 00 ff ff`).
fn segments(body: &[u8]) -> (Vec<&[u8]>, Vec<&[u8]>) {
    let (mut own, mut shared) = (Vec::new(), Vec::new());
    let mut at = 10;
    while at < body.len() {
        if body[at] & 0x07 == 0 {
            // A stored block: BFINAL 0, BTYPE 00, then LEN.
            let len = usize::from(u16::from_le_bytes([body[at + 1], body[at + 2]]));
            own.push(&body[at..at + 5 + len]);
            at += 5 + len;
        } else {
            let end = at + body[at..].windows(4).position(|w| w == [0, 0, 0xff, 0xff]).expect("a segment ends with its flush") + 4;
            shared.push(&body[at..end]);
            at = end;
        }
    }
    (own, shared)
}

async fn a_gzip_stream_is_shared_segments_that_inflate_live_and_end_checked(backend: Backend) {
    let app = spawn_app_with(backend, |s| s.streams.compression = Compression::On).await;
    // Every type, and one type only: the second stream's events follow
    // other events in the first.
    let (mut all, headers) = Raw::open(&app, "", Some("br;q=1.0, gzip;q=0.5")).await;
    assert_eq!(headers.get("content-encoding").map(|v| v.to_str().unwrap()), Some("gzip"));
    assert_eq!(headers.get("vary").map(|v| v.to_str().unwrap()), Some("accept-encoding"));
    let (mut some, _) = Raw::open(&app, "?types=order.shipped", Some("gzip")).await;
    let (mut plain, headers) = Raw::open(&app, "", None).await;
    assert!(headers.get("content-encoding").is_none(), "no Accept-Encoding: the plain stream");
    let (mut refused, headers) = Raw::open(&app, "", Some("gzip;q=0, br")).await;
    assert!(headers.get("content-encoding").is_none(), "gzip refused: the plain stream");

    let mut shipped = Vec::new();
    for i in 0..6 {
        let event_type = if i % 2 == 0 { "order.created" } else { "order.shipped" };
        let id = app.publish(event_type, json!({"order": format!("A-{i}"), "lines": [1, 2, 3]})).await;
        let needle = format!("id: {id}\ndata: {{\"envelope_version\":1,\"event_id\":{id},");
        // Each event inflates before the next is published: every segment
        // is flushed whole.
        all.until(&needle).await;
        plain.until(&needle).await;
        refused.until(&needle).await;
        if i % 2 == 1 {
            some.until(&needle).await;
            shipped.push(id);
        }
    }
    assert!(plain.text().starts_with("retry: "), "{}", plain.text());
    assert_eq!(plain.raw, plain.text().as_bytes(), "the plain stream is sent as it is");
    assert!(all.raw.starts_with(&[0x1f, 0x8b, 8]), "a gzip header first");

    // The segments of the events the second stream received are the same
    // bytes in the first, where other events came before them: compressed
    // once per event, not per stream.
    let (own, mine) = segments(&some.raw);
    assert_eq!((own.len(), mine.len()), (1, shipped.len()), "the opening chunk, then one segment per event");
    for segment in &mine {
        assert!(all.raw.windows(segment.len()).any(|w| w == *segment), "an event's segment is shared by every stream");
    }

    // At shutdown each stream ends with the gzip trailer, which the decoder
    // checks (CRC-32 and length of everything inflated).
    app.stop().await;
    for stream in [&mut all, &mut some] {
        stream.read_to_end().await;
        let mut text = String::new();
        flate2::read::GzDecoder::new(&stream.raw[..])
            .read_to_string(&mut text)
            .unwrap_or_else(|e| panic!("the whole stream inflates and its trailer checks: {e}"));
        assert!(text.ends_with("\n\n") && text.contains("\nretry: "), "the goodbye is inside: {text:?}");
        for id in &shipped {
            assert!(text.contains(&format!("id: {id}\n")));
        }
    }

    // With compression off (the default), a client that accepts gzip gets
    // the plain stream.
    let app = spawn_app(backend).await;
    let (mut off, headers) = Raw::open(&app, "", Some("gzip")).await;
    assert!(headers.get("content-encoding").is_none() && headers.get("vary").is_none());
    let id = app.publish("order.created", json!({})).await;
    off.until(&format!("id: {id}\n")).await;
    assert_eq!(off.raw, off.text().as_bytes());
}

/// curl with `--compressed` (which asks for gzip and inflates as it
/// reads) prints each event as it is published, and exits cleanly at the
/// stream's end, its trailer checked.
async fn curl_reads_a_compressed_stream(backend: Backend) {
    let app = spawn_app_with(backend, |s| s.streams.compression = Compression::On).await;
    let mut curl = tokio::process::Command::new("curl")
        .args(["-sS", "-N", "--compressed", "--max-time", "60", "-D", "/dev/stderr"])
        .arg(app.url("/v1/stream"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("curl runs");
    let mut out = curl.stdout.take().unwrap();
    let mut seen = Vec::new();
    // The stream's first bytes (`retry:`) come once it is registered: the
    // events published after them are its live ones.
    for i in 0..4 {
        let needle =
            if i == 0 { "retry: ".to_owned() } else { format!("id: {}\ndata: ", app.publish("order.created", json!({"n": i})).await) };
        tokio::time::timeout(Duration::from_secs(10), async {
            while !String::from_utf8_lossy(&seen).contains(&needle) {
                let mut buf = [0u8; 4096];
                let n = out.read(&mut buf).await.unwrap();
                assert!(n > 0, "curl's output ended early: {}", String::from_utf8_lossy(&seen));
                seen.extend_from_slice(&buf[..n]);
            }
        })
        .await
        .unwrap_or_else(|_| panic!("curl prints {needle:?} live; so far {:?}", String::from_utf8_lossy(&seen)));
    }
    app.stop().await;
    out.read_to_end(&mut seen).await.unwrap();
    let done = tokio::time::timeout(Duration::from_secs(10), curl.wait_with_output()).await.expect("curl ends").unwrap();
    let said = String::from_utf8_lossy(&done.stderr);
    assert!(done.status.success(), "curl ends cleanly (a bad trailer fails it): {said}");
    assert!(said.to_ascii_lowercase().contains("content-encoding: gzip"), "{said}");
    assert!(String::from_utf8_lossy(&seen).starts_with("retry: "));
}

/// A WebSocket client at the frame level (tungstenite's client has no
/// `permessage-deflate`): the upgrade's head, and frames with RSV1.
struct RawWs {
    tcp: tokio::net::TcpStream,
    read: Vec<u8>,
}

impl RawWs {
    /// Upgrades `/v1/ws`, offering `extensions`; returns the `101`'s head.
    async fn open(app: &TestApp, extensions: &str) -> (Self, String) {
        use tokio::io::AsyncWriteExt as _;
        let host = app.base.trim_start_matches("http://");
        let mut tcp = tokio::net::TcpStream::connect(host).await.unwrap();
        let head = format!(
            "GET /v1/ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Extensions: {extensions}\r\n\r\n"
        );
        tcp.write_all(head.as_bytes()).await.unwrap();
        let mut ws = RawWs { tcp, read: Vec::new() };
        let end = loop {
            if let Some(at) = ws.read.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            ws.fill().await;
        };
        let head = String::from_utf8(ws.read.drain(..end).collect()).unwrap().to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 101"), "{head}{}", String::from_utf8_lossy(&ws.read));
        (ws, head)
    }

    async fn fill(&mut self) {
        let mut buf = [0u8; 8192];
        let n = tokio::time::timeout(Duration::from_secs(10), self.tcp.read(&mut buf)).await.expect("the server answers").unwrap();
        assert!(n > 0, "the connection ended");
        self.read.extend_from_slice(&buf[..n]);
    }

    /// The next frame from the server: its header and payload.
    async fn frame(&mut self) -> (FrameHeader, Vec<u8>) {
        loop {
            let mut cursor = std::io::Cursor::new(self.read.as_slice());
            if let Some((header, len)) = FrameHeader::parse(&mut cursor).unwrap() {
                let at = cursor.position() as usize;
                if self.read.len() >= at + len as usize {
                    let payload = self.read[at..at + len as usize].to_vec();
                    self.read.drain(..at + len as usize);
                    return (header, payload);
                }
            }
            self.fill().await;
        }
    }

    /// The next message as JSON, inflated if it came compressed; and its
    /// payload as sent.
    async fn json(&mut self) -> (serde_json::Value, bool, Vec<u8>) {
        let (header, payload) = self.frame().await;
        let text = if header.rsv1 { inflate(&payload) } else { payload.clone() };
        (serde_json::from_slice(&text).unwrap_or_else(|_| panic!("JSON: {:?}", String::from_utf8_lossy(&text))), header.rsv1, payload)
    }

    /// Sends a masked text frame, compressed (RSV1, no context) or not.
    async fn send(&mut self, text: &[u8], compressed: bool) {
        use tokio::io::AsyncWriteExt as _;
        let payload = if compressed { deflate(text) } else { text.to_vec() };
        let mask = [0x12, 0x34, 0x56, 0x78];
        let header =
            FrameHeader { is_final: true, rsv1: compressed, rsv2: false, rsv3: false, opcode: OpCode::Data(Data::Text), mask: Some(mask) };
        let mut frame = Vec::new();
        header.format(payload.len() as u64, &mut frame).unwrap();
        frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i & 3]));
        self.tcp.write_all(&frame).await.unwrap();
    }
}

/// A `permessage-deflate` payload: raw deflate, sync-flushed, its closing
/// `00 00 ff ff` taken off (RFC 7692 §7.2.1).
fn deflate(text: &[u8]) -> Vec<u8> {
    let mut deflate = flate2::Compress::new(flate2::Compression::default(), false);
    let mut out = Vec::with_capacity(text.len() + 64);
    deflate.compress_vec(text, &mut out, flate2::FlushCompress::Sync).unwrap();
    assert!(out.ends_with(&[0, 0, 0xff, 0xff]));
    out.truncate(out.len() - 4);
    out
}

fn inflate(payload: &[u8]) -> Vec<u8> {
    let mut input = payload.to_vec();
    input.extend_from_slice(&[0, 0, 0xff, 0xff]);
    let mut inflate = flate2::Decompress::new(false);
    let mut out = Vec::with_capacity(1 << 20);
    inflate.decompress_vec(&input, &mut out, flate2::FlushDecompress::Sync).unwrap_or_else(|e| panic!("the payload inflates: {e}"));
    assert_eq!(inflate.total_in(), input.len() as u64, "the payload inflates whole");
    out
}

async fn a_device_gets_shared_compressed_events_and_may_send_compressed(backend: Backend) {
    const ANSWER: &str = "sec-websocket-extensions: permessage-deflate; server_no_context_takeover; client_no_context_takeover\r\n";
    let app = spawn_app_with(backend, |s| s.streams.compression = Compression::On).await;
    let key = crate::helpers::device::Key::new();
    let mut devices = Vec::new();
    for name in ["dev-a", "dev-b"] {
        let (mut ws, head) = RawWs::open(&app, "permessage-deflate; client_max_window_bits").await;
        assert!(head.contains(ANSWER), "{head}");
        let (hello, compressed, _) = ws.json().await;
        assert!(!compressed, "only events are compressed");
        let nonce = hello["params"]["nonce"].as_str().unwrap().to_owned();
        // The device's own request goes compressed, and is answered.
        let body = json!({"device_id": name, "filter": {"types": ["order.*"]}});
        let proof = key.proof("stream.auth", &body, &nonce);
        let auth = json!({"jsonrpc": "2.0", "id": 1, "method": "stream.auth", "params": {"body": body, "origin_proof": proof}});
        ws.send(auth.to_string().as_bytes(), true).await;
        let (answer, _, _) = ws.json().await;
        assert!(answer["result"].is_object(), "{answer}");
        devices.push(ws);
    }

    let id = app.publish("order.created", json!({"order": "A-1", "lines": [{"sku": "SKU-1", "qty": 2}]})).await;
    let mut payloads = Vec::new();
    for ws in &mut devices {
        let (event, compressed, payload) = ws.json().await;
        assert!(compressed, "an event goes compressed: {event}");
        assert_eq!((event["method"].as_str(), event["params"]["event"]["event_id"].as_i64()), (Some("stream.event"), Some(id)), "{event}");
        payloads.push(payload);
    }
    assert_eq!(payloads[0], payloads[1], "compressed once, the same bytes for every device");

    // A small message that inflates past the message limit: close 1009,
    // before anything of it is kept.
    let ws = &mut devices[0];
    ws.send(&vec![b' '; 1 << 20], true).await;
    let (close, payload) = loop {
        let (header, payload) = ws.frame().await;
        if header.opcode == OpCode::Control(Control::Close) {
            break (header, payload);
        }
    };
    assert!(!close.rsv1);
    assert_eq!(u16::from_be_bytes([payload[0], payload[1]]), 1009);

    // An offer the server cannot keep (a smaller window for its own
    // compressor), and a server with compression off: no extension.
    let (_, head) = RawWs::open(&app, "permessage-deflate; server_max_window_bits=10").await;
    assert!(!head.contains("sec-websocket-extensions"), "{head}");
    let off = spawn_app(backend).await;
    let (_, head) = RawWs::open(&off, "permessage-deflate").await;
    assert!(!head.contains("sec-websocket-extensions"), "{head}");
}
