//! The bench's compressed WebSocket device (`--transport ws --compressed`).
//!
//! tungstenite speaks no `permessage-deflate`, so this device speaks the
//! frames itself, and only as much as the bench needs: the upgrade offering
//! the extension (a server that does not take it fails the device), one
//! signed `stream.auth`, then messages read with tungstenite's frame-header
//! parser, each compressed one inflated alone (the server keeps no context
//! between messages, docs/ref-websocket.md), pings answered. Every byte it
//! reads is counted, so the report has the bytes per delivery on the wire.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context as _, bail, ensure};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::protocol::frame::FrameHeader;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Control, Data, OpCode};

use tidings_protocol::identity::ServerIdentity;
use tidings_protocol::ws::method;

/// Most a message may inflate to: the server's own default limit.
const MAX_MESSAGE: usize = 1 << 20;
/// Longest the upgrade, and then `stream.auth`, may take (a server that
/// never answers does not hold the bench).
const OPEN_WITHIN: std::time::Duration = std::time::Duration::from_secs(30);

/// A device whose messages arrive compressed.
pub(super) struct DeflateDevice {
    tcp: TcpStream,
    /// Read and not yet taken; `start` is where the untaken part begins.
    read: Vec<u8>,
    start: usize,
    inflate: flate2::Decompress,
    wire: Arc<AtomicU64>,
    nonce: String,
}

impl DeflateDevice {
    /// Upgrades `{base}/v1/ws` offering `permessage-deflate` with no
    /// context takeover, and reads `stream.hello`, within [`OPEN_WITHIN`].
    pub(super) async fn connect(base: &str, wire: &Arc<AtomicU64>) -> anyhow::Result<Self> {
        tokio::time::timeout(OPEN_WITHIN, Self::upgrade(base, wire)).await.context("the upgrade took longer than 30 s")?
    }

    async fn upgrade(base: &str, wire: &Arc<AtomicU64>) -> anyhow::Result<Self> {
        let host = base.trim_end_matches('/').strip_prefix("http://").context("the bench's compressed devices speak plain HTTP")?;
        let mut tcp = TcpStream::connect(host).await?;
        tcp.set_nodelay(true)?;
        let head = format!(
            "GET /v1/ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
             Sec-WebSocket-Extensions: permessage-deflate; client_no_context_takeover; server_no_context_takeover\r\n\r\n"
        );
        tcp.write_all(head.as_bytes()).await?;
        let mut device = Self {
            tcp,
            read: Vec::with_capacity(4096),
            start: 0,
            inflate: flate2::Decompress::new(false),
            wire: wire.clone(),
            nonce: String::new(),
        };
        let end = loop {
            if let Some(at) = device.read.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            ensure!(device.read.len() < 16 << 10, "the upgrade's answer has no end");
            device.fill().await?;
        };
        let answer = String::from_utf8_lossy(&device.read[..end]).to_ascii_lowercase();
        ensure!(answer.starts_with("http/1.1 101"), "the upgrade was refused: {answer}");
        ensure!(answer.contains("permessage-deflate"), "the server did not take permessage-deflate: {answer}");
        // (What the bench counts starts when it measures, long after.)
        device.start = end;
        let hello: Value = serde_json::from_str(&device.next_text().await?)?;
        ensure!(hello["method"] == method::HELLO, "expected stream.hello: {hello}");
        device.nonce = hello["params"]["nonce"].as_str().unwrap_or_default().to_owned();
        Ok(device)
    }

    /// Authenticates as a device of `key` with `body`, within
    /// [`OPEN_WITHIN`].
    pub(super) async fn auth(&mut self, key: &ServerIdentity, body: Value) -> anyhow::Result<()> {
        tokio::time::timeout(OPEN_WITHIN, self.authenticate(key, body)).await.context("stream.auth took longer than 30 s")?
    }

    async fn authenticate(&mut self, key: &ServerIdentity, body: Value) -> anyhow::Result<()> {
        let target = tidings_protocol::identity::proof_target(method::AUTH, &body, &self.nonce);
        let proof = json!({"identity": key.entity(), "signature": key.signature(&target)});
        let call = json!({"jsonrpc": "2.0", "id": 1, "method": method::AUTH, "params": {"body": body, "origin_proof": proof}});
        self.send_text(call.to_string().as_bytes()).await?;
        loop {
            let answer: Value = serde_json::from_str(&self.next_text().await?)?;
            if answer["id"] == 1 {
                ensure!(answer.get("error").is_none(), "stream.auth was refused: {answer}");
                return Ok(());
            }
        }
    }

    /// The next text message, inflated if it came compressed.
    pub(super) async fn next_text(&mut self) -> anyhow::Result<String> {
        loop {
            let (header, payload) = self.frame().await?;
            match header.opcode {
                OpCode::Data(Data::Text) => {
                    ensure!(header.is_final, "the bench reads unfragmented messages only");
                    let text = if header.rsv1 { inflated(&mut self.inflate, &payload)? } else { payload };
                    return Ok(String::from_utf8(text)?);
                }
                OpCode::Control(Control::Ping) => self.send(OpCode::Control(Control::Pong), &payload).await?,
                OpCode::Control(Control::Close) => bail!("the server closed the connection"),
                _ => {}
            }
        }
    }

    /// The next frame: its header and payload. A server's frame is not
    /// masked, and a control frame is final and at most 125 bytes
    /// (RFC 6455, 5.1 and 5.5).
    async fn frame(&mut self) -> anyhow::Result<(FrameHeader, Vec<u8>)> {
        loop {
            let mut cursor = std::io::Cursor::new(&self.read[self.start..]);
            if let Some((header, len)) = FrameHeader::parse(&mut cursor)? {
                ensure!(len <= MAX_MESSAGE as u64, "a frame of {len} bytes");
                ensure!(header.mask.is_none(), "the server masked a frame");
                if let OpCode::Control(_) = header.opcode {
                    ensure!(header.is_final && len <= 125, "a fragmented or {len}-byte control frame");
                }
                let at = self.start + cursor.position() as usize;
                let end = at + len as usize;
                if self.read.len() >= end {
                    let payload = self.read[at..end].to_vec();
                    self.start = end;
                    return Ok((header, payload));
                }
            }
            self.fill().await?;
        }
    }

    /// Reads what the socket has, dropping what was taken.
    async fn fill(&mut self) -> anyhow::Result<()> {
        if self.start > 0 {
            self.read.drain(..self.start);
            self.start = 0;
        }
        let had = self.read.len();
        self.read.resize(had + 8192, 0);
        let n = self.tcp.read(&mut self.read[had..]).await?;
        self.read.truncate(had + n);
        ensure!(n > 0, "the connection ended");
        self.wire.fetch_add(n as u64, Ordering::Relaxed);
        Ok(())
    }

    async fn send_text(&mut self, text: &[u8]) -> anyhow::Result<()> {
        self.send(OpCode::Data(Data::Text), text).await
    }

    /// Sends one masked frame (a client's frames are masked).
    async fn send(&mut self, opcode: OpCode, payload: &[u8]) -> anyhow::Result<()> {
        let mask: [u8; 4] = rand::random();
        let header = FrameHeader { is_final: true, rsv1: false, rsv2: false, rsv3: false, opcode, mask: Some(mask) };
        let mut frame = Vec::with_capacity(payload.len() + 14);
        header.format(payload.len() as u64, &mut frame)?;
        frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i & 3]));
        self.tcp.write_all(&frame).await?;
        Ok(())
    }
}

/// A compressed message's payload inflated (RFC 7692: its closing
/// `00 00 ff ff` was taken off), at most [`MAX_MESSAGE`] bytes. A message
/// may end in a final block (RFC 7692, 7.2.3.4): what is appended after
/// that end is not read, but bytes of the message after it are refused.
fn inflated(inflate: &mut flate2::Decompress, payload: &[u8]) -> anyhow::Result<Vec<u8>> {
    use flate2::{FlushDecompress, Status};
    inflate.reset(false);
    let mut out = Vec::with_capacity(payload.len() * 4);
    for (input, appended) in [(payload, false), (&[0, 0, 0xff, 0xff][..], true)] {
        let mut input = input;
        while !input.is_empty() {
            ensure!(out.len() < MAX_MESSAGE, "a message inflates past {MAX_MESSAGE} bytes");
            out.reserve(out.len().max(1024));
            let (before, had) = (inflate.total_in(), out.len());
            let status = inflate.decompress_vec(input, &mut out, FlushDecompress::Sync)?;
            let used = (inflate.total_in() - before) as usize;
            input = &input[used..];
            if status == Status::StreamEnd {
                // A sender that ends in a final block may leave the first
                // byte of an empty stored block after it (RFC 7692's own
                // example does); anything else is refused.
                ensure!(appended || input.is_empty() || input == [0], "bytes after the message's final block");
                return Ok(out);
            }
            ensure!(used > 0 || out.len() > had, "the message does not inflate");
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deflated(text: &[u8]) -> Vec<u8> {
        let mut deflate = flate2::Compress::new(flate2::Compression::default(), false);
        let mut out = Vec::with_capacity(text.len() + 64);
        deflate.compress_vec(text, &mut out, flate2::FlushCompress::Sync).unwrap();
        out.truncate(out.len() - 4);
        out
    }

    /// Messages inflate alone, one after another with one inflater; one
    /// that would inflate past the limit is refused; junk is an error.
    #[test]
    fn messages_inflate_alone_and_within_the_limit() {
        let mut inflate = flate2::Decompress::new(false);
        for text in [&b"{\"jsonrpc\":\"2.0\"}"[..], &[b'a'; 100_000][..]] {
            assert_eq!(inflated(&mut inflate, &deflated(text)).unwrap(), text);
        }
        assert!(inflated(&mut inflate, &deflated(&vec![0; MAX_MESSAGE * 2])).is_err());
        assert!(inflated(&mut inflate, &[0xff; 16]).is_err());
        // A final block, then more: refused, not read forever.
        let mut ended = flate2::Compress::new(flate2::Compression::default(), false);
        let mut finished = Vec::with_capacity(64);
        ended.compress_vec(b"x", &mut finished, flate2::FlushCompress::Finish).unwrap();
        let exact = finished.clone();
        finished.extend_from_slice(b"more");
        assert!(inflated(&mut inflate, &finished).is_err());
        // A message that ends in a final block inflates (the appended
        // 00 00 ff ff after its end is not read), with or without the
        // stored block's first byte after it: RFC 7692, 7.2.3.4's example.
        assert_eq!(inflated(&mut inflate, &exact).unwrap(), b"x");
        assert_eq!(inflated(&mut inflate, &[0xf3, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00, 0x00]).unwrap(), b"Hello");
    }

    /// What a server may not send: a masked frame, a control frame over
    /// 125 bytes or fragmented. A small final ping is read.
    #[tokio::test]
    async fn a_masked_frame_or_a_malformed_control_frame_is_refused() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = listener.local_addr().unwrap();
        let frame = |opcode, is_final, mask, len: usize| {
            let header = FrameHeader { is_final, rsv1: false, rsv2: false, rsv3: false, opcode, mask };
            let mut bytes = Vec::new();
            header.format(len as u64, &mut bytes).unwrap();
            bytes.resize(bytes.len() + len, 0);
            bytes
        };
        let ping = OpCode::Control(Control::Ping);
        let text = OpCode::Data(Data::Text);
        for (bytes, taken) in [
            (frame(text, true, Some([1, 2, 3, 4]), 4), false),
            (frame(ping, true, None, 126), false),
            (frame(ping, false, None, 4), false),
            (frame(ping, true, None, 125), true),
            (frame(text, true, None, 4), true),
        ] {
            let mut device = DeflateDevice {
                tcp: TcpStream::connect(at).await.unwrap(),
                read: bytes,
                start: 0,
                inflate: flate2::Decompress::new(false),
                wire: Arc::default(),
                nonce: String::new(),
            };
            let read = tokio::time::timeout(std::time::Duration::from_secs(10), device.frame()).await.expect("read without waiting");
            assert_eq!(read.is_ok(), taken, "{:?}", &device.read[..2]);
        }
    }
}
