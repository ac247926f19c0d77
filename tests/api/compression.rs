//! Compressed streams (`TIDINGS_COMPRESSION=on`, docs/streams.md#compression):
//! a client that accepts gzip gets one gzip stream, each event inflating as
//! it arrives, built from segments compressed once per event and shared by
//! every stream (the same bytes whatever came before them), ended by a
//! trailer the decoder checks; a client that does not accept it, and every
//! client of a server with compression off, gets the plain stream; curl
//! reads it with `--compressed`.

use std::io::{Read as _, Write as _};
use std::time::Duration;

use futures_util::StreamExt as _;
use serde_json::json;
use tokio::io::AsyncReadExt as _;

use crate::both_stores;
use crate::helpers::{Backend, TestApp, spawn_app, spawn_app_with};
use tidings_server::config::Compression;

both_stores!(a_gzip_stream_is_shared_segments_that_inflate_live_and_end_checked, curl_reads_a_compressed_stream);

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

/// Splits a gzip body after its 10-byte header into its flushed segments
/// (each ends with the empty stored block `00 00 ff ff`).
fn segments(body: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut start = 10;
    let mut at = start;
    while at + 4 <= body.len() {
        if body[at..at + 4] == [0, 0, 0xff, 0xff] {
            out.push(&body[start..at + 4]);
            start = at + 4;
            at = start;
        } else {
            at += 1;
        }
    }
    out
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
    let mine = segments(&some.raw);
    assert_eq!(mine.len(), 1 + shipped.len(), "the opening chunk, then one segment per event");
    for segment in &mine[1..] {
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
