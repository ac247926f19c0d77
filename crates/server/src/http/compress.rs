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
//! The cost of sharing is the ratio: an event does not refer back to the
//! events before it, so a stream of similar small events shrinks less than
//! a per-client stream would (docs/benchmarks.md has the bytes).

use std::cell::RefCell;

use axum::http::{HeaderMap, header};
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
        Bytes::from(out)
    })
}

/// One compressed stream's own state: whether its header went out, and
/// the CRC-32 and length of the plain bytes it sent, for its trailer.
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

    /// `plain` compressed on its own, as this stream writes it: for what
    /// goes to one stream only (its first bytes, heartbeats, notices).
    pub(crate) fn own(&mut self, plain: &[u8]) -> Bytes {
        self.write(plain, segment(plain))
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

    use axum::http::HeaderValue;

    use super::*;

    fn headers(lines: &[&str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for line in lines {
            map.append(header::ACCEPT_ENCODING, HeaderValue::from_str(line).unwrap());
        }
        map
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
            .chain([vec![], vec![b'x'; 100_000], b":\n\n".to_vec()])
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
        assert!(body.len() < plain.len() / 10, "the repeated bytes compress");

        let mut broken = body.clone();
        let at = broken.len() - 5;
        broken[at] ^= 1;
        assert!(flate2::read::GzDecoder::new(&broken[..]).read_to_end(&mut Vec::new()).is_err(), "the trailer is checked");
    }
}
