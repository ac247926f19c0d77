//! The first request's head on a new connection: read whole (under the
//! caller's header deadline), then sorted: a stream request (an HTTP/1.1
//! `GET` of a stream route, nothing behind it) is served by this module's
//! parent without hyper; the HTTP/2 preface and everything else go to hyper
//! with the bytes already read; a head over the limits ([`MAX_TARGET`],
//! [`MAX_HEAD`], [`MAX_HEADERS`]) is refused here.

use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, Method, Request, Version};
use bytes::Bytes;
use tokio::io::AsyncReadExt as _;
use tokio::net::TcpStream;

use crate::server::{HeadRefusal, MAX_HEAD, MAX_HEADERS, MAX_TARGET};

/// What sniffing the first request found.
pub(in crate::server) enum First {
    /// A stream request, already parsed.
    Stream(Box<Request<Body>>),
    /// Anything else, its head read whole: hand the connection to hyper
    /// with these bytes first.
    Other(Bytes),
    /// The HTTP/2 connection preface (h2c with prior knowledge, as proxies
    /// speak it): hand the connection to hyper's HTTP/2 with these bytes
    /// first.
    H2c(Bytes),
    /// A head over the limits: answer this refusal and close.
    Refused(HeadRefusal),
    /// The client went away (or sent nothing in time).
    Gone,
}

/// Reads the first request's whole head (any method: the caller bounds
/// this by the header deadline, so the deadline holds for the whole head
/// however slowly it trickles in, and hyper then finds it complete);
/// `direct` says which paths stream.
pub(in crate::server) async fn sniff(stream: &mut TcpStream, direct: fn(&str) -> bool) -> First {
    let mut head = Vec::with_capacity(1024);
    loop {
        // Straight into the head's spare room: nothing but the head lives
        // across this await, so every connection's task stays small (it is
        // sized for its largest state, for as long as the connection lives).
        if head.len() == head.capacity() {
            head.reserve(1024);
        }
        match stream.read_buf(&mut head).await {
            Ok(0) | Err(_) => return First::Gone,
            Ok(_) => {}
        }
        if let Some(first) = parse_head(head.as_slice(), direct) {
            return match first {
                Parsed::Other => First::Other(head.into()),
                Parsed::H2c => First::H2c(head.into()),
                Parsed::Done(first) => first,
            };
        }
    }
}

/// What a head read so far comes to.
enum Parsed {
    /// Hand the head to hyper.
    Other,
    /// The HTTP/2 preface: hand the connection to hyper's HTTP/2.
    H2c,
    Done(First),
}

/// What an HTTP/2 client with prior knowledge sends first (RFC 9113 §3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Parses `head` (on the stack of a plain function: the header array is
/// 3 KiB); `None` while it is incomplete.
fn parse_head(head: &[u8], direct: fn(&str) -> bool) -> Option<Parsed> {
    if head.starts_with(H2_PREFACE) {
        return Some(Parsed::H2c);
    }
    if H2_PREFACE.starts_with(head) {
        return None;
    }
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(head) {
        Ok(httparse::Status::Complete(len)) => {
            let target = request.path.unwrap_or("");
            if target.len() > MAX_TARGET {
                return Some(Parsed::Done(First::Refused(HeadRefusal::UriTooLong)));
            }
            let path = target.split_once('?').map_or(target, |(p, _)| p);
            // Only an HTTP/1.1 GET of a stream route with nothing behind it
            // (no pipelined request) takes the direct path; hyper serves
            // everything else.
            if request.method != Some("GET") || request.version != Some(1) || len != head.len() || !direct(path) {
                return Some(Parsed::Other);
            }
            Some(build(&request).map_or(Parsed::Other, |r| Parsed::Done(First::Stream(Box::new(r)))))
        }
        Err(httparse::Error::TooManyHeaders) => Some(Parsed::Done(First::Refused(HeadRefusal::HeadersTooLarge))),
        // Anything that does not parse: hyper answers it.
        Err(_) => Some(Parsed::Other),
        Ok(httparse::Status::Partial) if head.len() > MAX_HEAD => {
            // Over the limit: the request line itself, or the headers.
            let line = head.iter().position(|&b| b == b'\n').unwrap_or(head.len());
            Some(Parsed::Done(First::Refused(if line > MAX_TARGET { HeadRefusal::UriTooLong } else { HeadRefusal::HeadersTooLarge })))
        }
        Ok(httparse::Status::Partial) => None,
    }
}

fn build(parsed: &httparse::Request<'_, '_>) -> Option<Request<Body>> {
    let mut request = Request::builder().method(Method::GET).uri(parsed.path?).version(Version::HTTP_11).body(Body::empty()).ok()?;
    let headers = request.headers_mut();
    for h in parsed.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes()).ok()?;
        headers.append(name, HeaderValue::from_bytes(h.value).ok()?);
    }
    // A stream request carries no body; one that announces a body is not
    // what this path serves.
    if headers.contains_key(axum::http::header::CONTENT_LENGTH) || headers.contains_key(axum::http::header::TRANSFER_ENCODING) {
        return None;
    }
    Some(request)
}
#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests start the tasks they drive")]
mod tests {
    use super::*;

    /// What a head comes to, as the table writes it.
    #[derive(Debug, PartialEq, Eq)]
    enum Sorted {
        /// Served here: the request's target.
        Stream(String),
        Hyper,
        H2c,
        Refused(HeadRefusal),
        /// Not whole yet: read more.
        Incomplete,
    }

    fn sort(head: &[u8]) -> Sorted {
        match parse_head(head, |path| path == "/v1/stream") {
            None => Sorted::Incomplete,
            Some(Parsed::Other) => Sorted::Hyper,
            Some(Parsed::H2c) => Sorted::H2c,
            Some(Parsed::Done(First::Stream(request))) => Sorted::Stream(request.uri().to_string()),
            Some(Parsed::Done(First::Refused(refusal))) => Sorted::Refused(refusal),
            Some(Parsed::Done(First::Other(_) | First::H2c(_) | First::Gone)) => unreachable!("parse_head never says so"),
        }
    }

    /// The wire table: what arrives first on a connection, and where it
    /// goes.
    #[test]
    fn first_heads_sort_by_the_wire_table() {
        use Sorted::*;
        let stream = "GET /v1/stream?types=a.b HTTP/1.1\r\nhost: x\r\nlast-event-id: 7\r\n\r\n";
        let long_target = format!("GET /v1/stream?x={} HTTP/1.1\r\n\r\n", "a".repeat(MAX_TARGET));
        let many_headers = format!("GET /v1/stream HTTP/1.1\r\n{}\r\n", "x-a: 1\r\n".repeat(MAX_HEADERS + 1));
        let endless_header = format!("GET /v1/stream HTTP/1.1\r\nx-a: {}", "a".repeat(MAX_HEAD));
        let endless_line = format!("GET /{}", "a".repeat(MAX_HEAD));
        let cases: Vec<(&str, &[u8], Sorted)> = vec![
            ("a stream request", stream.as_bytes(), Stream("/v1/stream?types=a.b".into())),
            ("half a stream request", &stream.as_bytes()[..30], Incomplete),
            ("HTTP/1.0", b"GET /v1/stream HTTP/1.0\r\n\r\n", Hyper),
            ("another method", b"POST /v1/stream HTTP/1.1\r\ncontent-length: 0\r\n\r\n", Hyper),
            ("another route", b"GET /v1/poll HTTP/1.1\r\n\r\n", Hyper),
            ("a stream request announcing a body", b"GET /v1/stream HTTP/1.1\r\ncontent-length: 3\r\n\r\n", Hyper),
            ("a chunked body", b"GET /v1/stream HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n", Hyper),
            ("a pipelined second request", b"GET /v1/stream HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\n", Hyper),
            ("a header value no header can hold", b"GET /v1/stream HTTP/1.1\r\nx-a: \x01\r\n\r\n", Hyper),
            ("not HTTP (a TLS hello)", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", Hyper),
            ("the HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x12\x04", H2c),
            ("part of the preface", b"PRI * HTTP/2.0\r\n", Incomplete),
            ("a target over the limit", long_target.as_bytes(), Refused(HeadRefusal::UriTooLong)),
            ("too many headers", many_headers.as_bytes(), Refused(HeadRefusal::HeadersTooLarge)),
            ("a header that never ends", endless_header.as_bytes(), Refused(HeadRefusal::HeadersTooLarge)),
            ("a request line that never ends", endless_line.as_bytes(), Refused(HeadRefusal::UriTooLong)),
        ];
        for (what, arrives, goes) in cases {
            assert_eq!(sort(arrives), goes, "{what}");
        }
    }

    /// A head trickling in a byte at a time is sorted once it is whole,
    /// the same as arriving at once.
    #[tokio::test]
    async fn a_trickled_head_is_read_whole() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        let head = b"GET /v1/poll HTTP/1.1\r\nhost: x\r\n\r\n";
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt as _;
            for byte in head {
                client.write_all(&[*byte]).await.unwrap();
                client.flush().await.unwrap();
                tokio::task::yield_now().await;
            }
            client
        });
        match tokio::time::timeout(std::time::Duration::from_secs(10), sniff(&mut server, |p| p == "/v1/stream")).await.unwrap() {
            First::Other(read) => assert_eq!(&read[..], head, "hyper gets every byte read"),
            _ => panic!("a poll goes to hyper"),
        }
        drop(writer.await.unwrap());
    }
}
