//! Streams compressed once per event, not once per client
//! (docs/streams.md#compression).
//!
//! A compressed response is normally one deflate stream per client, whose
//! every part refers back to what that client received before: each
//! client's bytes differ, and each costs its own compression, which for a
//! broker is the price of an event times its subscribers. tidings
//! compresses each event's frame alone instead, once, when its first
//! compressed stream writes it: a raw deflate segment that refers to
//! nothing outside itself and ends with a sync flush (an empty stored
//! block), so it is whole, ends on a byte, and may follow any other such
//! segment. A stream's body is the gzip header, the segments of what it
//! receives in order, and, at its end, a final empty block with the CRC-32
//! and length of what it received: one valid gzip stream, which every
//! decoder inflates as it arrives (each segment is flushed), built from
//! segments shared by every stream as the plain frames are. What a stream
//! pays on its own is the CRC-32 of its plain bytes.
//!
//! A WebSocket that negotiated `permessage-deflate` (RFC 7692) with no
//! context takeover either way gets its events the same way: each event's
//! `stream.event` message compressed once, alone, and shared
//! ([`message`]); what a client sends compressed is inflated alone, into
//! at most the message limit ([`inflate_message`]).
//!
//! The cost of sharing is the ratio: an event does not refer back to the
//! events before it, so a stream of similar small events shrinks less than
//! a per-client stream would (docs/benchmarks.md has the bytes).

use std::cell::RefCell;

use axum::http::{HeaderMap, HeaderValue, header};
use bytes::{BufMut as _, Bytes, BytesMut};
use flate2::{Compress, Compression, FlushCompress};

/// The gzip member header (RFC 1952): deflate, no name, no time, no extra
/// fields, operating system unknown.
const GZIP_HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];

/// `data` as one raw deflate segment that refers to nothing before it,
/// ended by a sync flush (see the module docs).
pub(crate) fn segment(data: &[u8]) -> Bytes {
    thread_local! {
        // One compressor per worker thread, reset for each segment: a
        // fresh one would allocate its tables (hundreds of KiB) every time.
        static DEFLATE: RefCell<Compress> = RefCell::new(Compress::new(Compression::default(), false));
    }
    DEFLATE.with_borrow_mut(|deflate| {
        deflate.reset();
        // Room for the worst case (stored blocks), so one call takes it all.
        let mut out = Vec::with_capacity(data.len() + data.len() / 8 + 64);
        let mut input = data;
        loop {
            if out.capacity() - out.len() < 64 {
                out.reserve(out.capacity().max(64));
            }
            let before = deflate.total_in();
            // With room for the worst case, one call takes every byte and
            // flushes once (another call would flush again: a few bytes
            // more, still one whole segment). A compressor in memory fails
            // only on a misuse of its API.
            deflate.compress_vec(input, &mut out, FlushCompress::Sync).expect("deflating into memory");
            let taken = usize::try_from(deflate.total_in() - before).unwrap_or(input.len());
            input = &input[taken..];
            // The flush is done once all input is taken and the output
            // was not filled.
            if input.is_empty() && out.len() < out.capacity() {
                break;
            }
        }
        // Kept with its event for as long as the event is queued: without
        // the room reserved for the worst case.
        out.shrink_to_fit();
        Bytes::from(out)
    })
}

/// `data` as one `permessage-deflate` message payload (RFC 7692 §7.2.1): a
/// segment without its closing `00 00 ff ff`.
pub(crate) fn message(data: &[u8]) -> Bytes {
    let segment = segment(data);
    segment.slice(..segment.len() - SYNC_TAIL.len())
}

/// The empty stored block a sync flush ends with.
const SYNC_TAIL: [u8; 4] = [0, 0, 0xff, 0xff];

/// Why a compressed message was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum InflateError {
    /// It inflates to more than the limit.
    #[error("a compressed message that inflates over the limit")]
    TooBig,
    /// It is not deflate data.
    #[error("a compressed message that does not inflate")]
    Corrupt,
}

/// A `permessage-deflate` message payload inflated on its own (no context
/// taken over from the messages before it), into at most `limit` bytes:
/// a small message that would inflate past it (a bomb) stops there.
pub(crate) fn inflate_message(payload: &[u8], limit: usize) -> Result<Vec<u8>, InflateError> {
    use flate2::{Decompress, FlushDecompress, Status};
    let mut input = Vec::with_capacity(payload.len() + SYNC_TAIL.len());
    input.extend_from_slice(payload);
    input.extend_from_slice(&SYNC_TAIL);
    let mut rest = input.as_slice();
    let mut inflate = Decompress::new(false);
    let mut out = Vec::new();
    loop {
        // Room for at most one byte past the limit: that byte refuses it.
        let want = (out.len() + 4096).min(limit + 1);
        if out.capacity() < want {
            out.reserve_exact(want - out.len());
        }
        let before = (inflate.total_in(), inflate.total_out());
        let status = inflate.decompress_vec(rest, &mut out, FlushDecompress::None).map_err(|_| InflateError::Corrupt)?;
        let taken = usize::try_from(inflate.total_in() - before.0).unwrap_or(rest.len());
        rest = &rest[taken..];
        if out.len() > limit {
            return Err(InflateError::TooBig);
        }
        if status == Status::StreamEnd || (rest.is_empty() && out.len() < out.capacity()) {
            return Ok(out);
        }
        if taken == 0 && inflate.total_out() == before.1 {
            // Input left and room to write, yet nothing moves.
            return Err(InflateError::Corrupt);
        }
    }
}

/// A `permessage-deflate` offer the server takes (RFC 7692 §7.1): whether
/// it named the server's window, which the answer must then name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Offer {
    server_window: bool,
}

impl Offer {
    /// The first offer in `Sec-WebSocket-Extensions` the server can take:
    /// one whose parameters are all known, each given once with a valid
    /// value, that does not ask the server for a window under 15 bits (the
    /// only one its compressor has). A client's own window needs no
    /// answer: the server inflates any.
    pub(crate) fn of(headers: &HeaderMap) -> Option<Self> {
        let lines = headers.get_all(header::SEC_WEBSOCKET_EXTENSIONS).iter().filter_map(|line| line.to_str().ok());
        lines.flat_map(|line| line.split(',')).find_map(Self::parse)
    }

    fn parse(offer: &str) -> Option<Self> {
        let mut parts = offer.split(';').map(str::trim);
        if !parts.next().is_some_and(|name| name.eq_ignore_ascii_case("permessage-deflate")) {
            return None;
        }
        let bits = |v: &str| v.trim_matches('"').parse::<u8>().ok().filter(|b| (8..=15).contains(b));
        let mut seen: Vec<String> = Vec::new();
        for param in parts {
            let (name, value) = match param.split_once('=') {
                Some((name, value)) => (name.trim().to_ascii_lowercase(), Some(value.trim())),
                None => (param.to_ascii_lowercase(), None),
            };
            let known = match (name.as_str(), value) {
                ("server_no_context_takeover" | "client_no_context_takeover" | "client_max_window_bits", None) => true,
                ("client_max_window_bits", Some(v)) => bits(v).is_some(),
                ("server_max_window_bits", Some(v)) => bits(v) == Some(15),
                _ => false,
            };
            if !known || seen.contains(&name) {
                return None;
            }
            seen.push(name);
        }
        Some(Self { server_window: seen.iter().any(|name| name == "server_max_window_bits") })
    }

    /// The server's answer: no context taken over either way, so every
    /// message is compressed, and inflated, alone; the server's window
    /// named when the offer named it (§7.1.2.1).
    pub(crate) fn answer(self) -> HeaderValue {
        HeaderValue::from_static(if self.server_window {
            "permessage-deflate; server_no_context_takeover; client_no_context_takeover; server_max_window_bits=15"
        } else {
            "permessage-deflate; server_no_context_takeover; client_no_context_takeover"
        })
    }
}

/// One compressed stream's own state: whether its header went out, and
/// the CRC-32 and length of the plain bytes it sent, for its trailer.
#[derive(Debug)]
pub(crate) struct Gzip {
    started: bool,
    crc: flate2::Crc,
    len: u64,
}

impl Default for Gzip {
    fn default() -> Self {
        Self { started: false, crc: flate2::Crc::new(), len: 0 }
    }
}

impl Gzip {
    /// `packed` (the segment of `plain`) as this stream writes it, counted:
    /// behind the gzip header if it is the stream's first.
    pub(crate) fn write(&mut self, plain: &[u8], packed: Bytes) -> Bytes {
        self.crc.update(plain);
        self.len += plain.len() as u64;
        if self.started {
            return packed;
        }
        self.started = true;
        let mut out = BytesMut::with_capacity(GZIP_HEADER.len() + packed.len());
        out.put_slice(&GZIP_HEADER);
        out.put_slice(&packed);
        out.freeze()
    }

    /// `plain` as this stream writes it, in stored (uncompressed) blocks:
    /// for what goes to one stream only (its first bytes, heartbeats,
    /// notices), a few bytes each, which would gain nothing from the
    /// compressor and pay its reset (some 300 KiB of tables cleared).
    pub(crate) fn own(&mut self, plain: &[u8]) -> Bytes {
        let mut stored = BytesMut::with_capacity(plain.len() + 5 * (plain.len() / 0xffff + 1));
        for block in plain.chunks(0xffff) {
            // BFINAL = 0, BTYPE = 00, to the byte's end; LEN and its
            // complement.
            let len = block.len() as u16;
            stored.put_u8(0);
            stored.put_u16_le(len);
            stored.put_u16_le(!len);
            stored.put_slice(block);
        }
        self.write(plain, stored.freeze())
    }

    /// The end of the stream: a final empty block, the CRC-32 and the
    /// length (modulo 2^32) of everything sent.
    pub(crate) fn trailer(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(10);
        // BFINAL = 1, BTYPE = 01 (fixed codes), then the end-of-block code.
        out.put_slice(&[0x03, 0x00]);
        out.put_u32_le(self.crc.sum());
        out.put_u32_le(self.len as u32);
        out.freeze()
    }
}

/// Whether the request accepts a gzip body (`Accept-Encoding`, RFC 9110
/// §12.5.3): `gzip` (or `x-gzip`, or `*` when gzip is not named) with a
/// weight above zero, in any of the header's lines. A header that does not
/// parse accepts nothing but the plain body.
pub(crate) fn accepts_gzip(headers: &HeaderMap) -> bool {
    let mut gzip = None;
    let mut any = None;
    for line in headers.get_all(header::ACCEPT_ENCODING) {
        let Ok(line) = line.to_str() else { return false };
        for item in line.split(',') {
            let mut parts = item.split(';');
            let coding = parts.next().unwrap_or("").trim();
            let mut weight = Some(1.0);
            for param in parts {
                let Some((name, value)) = param.split_once('=') else { continue };
                if name.trim().eq_ignore_ascii_case("q") {
                    weight = value.trim().parse::<f32>().ok().filter(|q| (0.0..=1.0).contains(q));
                }
            }
            let Some(weight) = weight else { continue };
            if coding.eq_ignore_ascii_case("gzip") || coding.eq_ignore_ascii_case("x-gzip") {
                gzip = Some(gzip.map_or(weight, |w: f32| w.max(weight)));
            } else if coding == "*" {
                any = Some(weight);
            }
        }
    }
    gzip.or(any).is_some_and(|w| w > 0.0)
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use super::*;

    fn headers(lines: &[&str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for line in lines {
            map.append(header::ACCEPT_ENCODING, HeaderValue::from_str(line).unwrap());
        }
        map
    }

    /// The offers the server takes, and those it declines; an offer that
    /// named the server's window is answered with it.
    #[test]
    fn a_deflate_offer_is_taken_only_in_a_form_the_server_can_keep() {
        let offer = |line: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::SEC_WEBSOCKET_EXTENSIONS, HeaderValue::from_str(line).unwrap());
            Offer::of(&headers)
        };
        for (line, taken) in [
            ("permessage-deflate", true),
            ("permessage-deflate; client_max_window_bits", true),
            ("Permessage-Deflate; client_max_window_bits=10; server_no_context_takeover", true),
            ("permessage-deflate; server_max_window_bits=15", true),
            ("permessage-deflate; client_no_context_takeover; server_no_context_takeover", true),
            ("x-webkit-deflate-frame, permessage-deflate; server_max_window_bits=10, permessage-deflate", true),
            ("permessage-deflate; server_max_window_bits=10", false),
            ("permessage-deflate; server_max_window_bits", false),
            ("permessage-deflate; client_max_window_bits=16", false),
            ("permessage-deflate; client_max_window_bits=7", false),
            ("permessage-deflate; mystery", false),
            ("permessage-deflate; server_no_context_takeover; server_no_context_takeover", false),
            ("permessage-deflate; server_no_context_takeover=1", false),
            ("x-webkit-deflate-frame", false),
            ("", false),
        ] {
            assert_eq!(offer(line).is_some(), taken, "{line:?}");
        }
        assert!(Offer::of(&HeaderMap::new()).is_none());
        let named = offer("permessage-deflate; server_max_window_bits=15").unwrap().answer();
        assert!(named.to_str().unwrap().ends_with("; server_max_window_bits=15"));
        let plain = offer("permessage-deflate; server_max_window_bits=10, permessage-deflate").unwrap().answer();
        assert_eq!(plain, "permessage-deflate; server_no_context_takeover; client_no_context_takeover");
    }

    /// A message compressed alone inflates alone; one that would inflate
    /// past the limit stops there; bytes that are not deflate data are
    /// refused.
    #[test]
    fn a_message_inflates_alone_within_its_limit() {
        let text = br#"{"jsonrpc":"2.0","id":7,"method":"stream.ack","params":{"body":{"seq":12}}}"#;
        let packed = message(text);
        assert!(!packed.ends_with(&SYNC_TAIL));
        assert_eq!(inflate_message(&packed, text.len()).unwrap(), text);
        assert_eq!(inflate_message(&packed, text.len() - 1), Err(InflateError::TooBig));
        let bomb = message(&vec![b'a'; 10 << 20]);
        assert!(bomb.len() < 20_000, "{}", bomb.len());
        assert_eq!(inflate_message(&bomb, 64 << 10), Err(InflateError::TooBig));
        assert_eq!(inflate_message(&message(b""), 10).unwrap(), b"");
        for junk in [&b"\xff\xff\xff\xff"[..], b"\x07", &[0xff; 100]] {
            assert_eq!(inflate_message(junk, 1000), Err(InflateError::Corrupt), "{junk:?}");
        }
    }

    #[test]
    fn gzip_is_taken_only_when_the_client_accepts_it() {
        for (lines, accepted) in [
            (&[][..], false),
            (&["gzip"][..], true),
            (&["GZIP"][..], true),
            (&["x-gzip"][..], true),
            (&["gzip, deflate, br, zstd"][..], true),
            (&["br;q=1.0, gzip;q=0.5"][..], true),
            (&["gzip;q=0"][..], false),
            (&["gzip;q=0.000"][..], false),
            (&["*"][..], true),
            (&["*;q=0"][..], false),
            (&["gzip;q=0, *"][..], false),
            (&["identity"][..], false),
            (&["br", "gzip"][..], true),
            (&["gzip;q=2"][..], false),
            (&["gzip;q=abc"][..], false),
            (&["deflate, gzip;q=0.1"][..], true),
        ] {
            assert_eq!(accepts_gzip(&headers(lines)), accepted, "{lines:?}");
        }
    }

    /// Segments compressed alone, in any order and any number, make one
    /// gzip stream with the header and trailer around them: it inflates to
    /// the plain bytes, its CRC and length checked by the decoder.
    #[test]
    fn independent_segments_make_one_gzip_stream() {
        let frames: Vec<Vec<u8>> = (0..50)
            .map(|i| format!("id: {i}\ndata: {{\"event_type\":\"order.created\",\"payload\":{{\"n\":{}}}}}\n\n", i * 7).into_bytes())
            .chain([vec![b'x'; 100_000], vec![], b":\n\n".to_vec(), vec![b'y'; 70_000]])
            .collect();
        let mut body = Vec::new();
        let mut gzip = Gzip::default();
        let mut plain = Vec::new();
        for (i, frame) in frames.iter().enumerate() {
            let shared = segment(frame);
            assert_eq!(shared, segment(frame), "a segment does not depend on what was compressed before");
            assert!(shared.ends_with(&[0, 0, 0xff, 0xff]), "each segment ends with a sync flush");
            assert_eq!(shared.windows(4).filter(|w| *w == [0, 0, 0xff, 0xff]).count(), 1, "and holds one flush only");
            let written = if i % 2 == 0 { gzip.write(frame, shared) } else { gzip.own(frame) };
            assert_eq!(written.starts_with(&GZIP_HEADER), i == 0, "the header goes first, once");
            body.extend_from_slice(&written);
            plain.extend_from_slice(frame);
        }
        body.extend_from_slice(&gzip.trailer());
        let mut inflated = Vec::new();
        flate2::read::GzDecoder::new(&body[..]).read_to_end(&mut inflated).unwrap();
        assert_eq!(inflated, plain);
        assert!(body.len() < 80_000, "the shared segments compress, the stream's own chunks are stored: {}", body.len());

        let mut broken = body.clone();
        let at = broken.len() - 5;
        broken[at] ^= 1;
        assert!(flate2::read::GzDecoder::new(&broken[..]).read_to_end(&mut Vec::new()).is_err(), "the trailer is checked");
    }
}
