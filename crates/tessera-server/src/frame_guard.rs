//! `FrameGuard`: watches a WebSocket's raw inbound bytes before actix buffers them.
//!
//! WHY: actix-web-actors' `WsStream` appends every payload chunk to one buffer, and actix's
//! codec reports an oversized frame (`Overflow`) only once the *whole* frame has arrived. A
//! client that announces a 1 GiB frame and streams it would be buffered in full. The guard
//! parses the frame headers on the byte stream itself and ends the stream the moment a frame
//! announces more than the hard limit, so a connection never buffers more than one frame of
//! at most the hard limit (plus one read chunk) before that frame completes.
//!
//! It also checks that text messages are UTF-8 as their bytes arrive (fragmented ones across
//! their frames), so invalid text closes with 1007 as RFC 6455 §8.1 asks; actix would only
//! report it as a generic I/O error once the frame is complete.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll};

use actix_web::error::PayloadError;
use actix_web::web::Bytes;
use futures::Stream;

/// Why the guard ended a connection's stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Violation {
    /// A frame announced more payload than the hard limit (close 1009).
    TooLarge,
    /// A text message is not UTF-8 (close 1007).
    InvalidUtf8,
}

impl Violation {
    fn code(self) -> u8 {
        match self {
            Self::TooLarge => 1,
            Self::InvalidUtf8 => 2,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Self::TooLarge),
            2 => Some(Self::InvalidUtf8),
            _ => None,
        }
    }
}

/// The guard's verdict, read by the connection actor when its stream reports an error (the
/// error itself reaches the actor only as text, wrapped by actix).
#[derive(Debug, Clone, Default)]
pub struct GuardVerdict(Arc<AtomicU8>);

impl GuardVerdict {
    /// The violation that ended the stream, if the guard ended it.
    pub fn violation(&self) -> Option<Violation> {
        Violation::from_code(self.0.load(Ordering::Relaxed))
    }

    fn set(&self, violation: Violation) {
        self.0.store(violation.code(), Ordering::Relaxed);
    }
}

/// Where the scanner is in the frame sequence.
#[derive(Debug)]
enum Scan {
    /// Reading a frame header (2 to 14 bytes).
    Header { bytes: [u8; 14], have: usize },
    /// Passing `remaining` payload bytes of the current frame.
    Payload {
        remaining: u64,
        /// Bytes of a text message: unmasked with `mask` from `offset` and checked.
        text: bool,
        mask: [u8; 4],
        offset: usize,
        /// The frame ends its message (FIN).
        last: bool,
    },
}

impl Scan {
    fn header() -> Self {
        Self::Header {
            bytes: [0; 14],
            have: 0,
        }
    }
}

/// The header's full length once its first two bytes are known (RFC 6455 §5.2).
fn header_len(first_two: [u8; 2]) -> usize {
    let extended = match first_two[1] & 0x7f {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    let mask = if first_two[1] & 0x80 != 0 { 4 } else { 0 };
    2 + extended + mask
}

/// The payload length a complete header announces.
fn announced_len(header: &[u8]) -> u64 {
    match header[1] & 0x7f {
        126 => u64::from(u16::from_be_bytes([header[2], header[3]])),
        127 => {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(&header[2..10]);
            u64::from_be_bytes(bytes)
        }
        n => u64::from(n),
    }
}

/// Follows frame boundaries over the byte stream (frames are not modified).
#[derive(Debug)]
struct Scanner {
    hard_limit: u64,
    scan: Scan,
    /// A fragmented text message is open (its continuation frames are text).
    in_text_message: bool,
    /// The end of a UTF-8 sequence cut by a chunk or frame boundary (at most 3 bytes).
    utf8_tail: Vec<u8>,
    /// Unmasked text bytes being checked (reused).
    scratch: Vec<u8>,
}

impl Scanner {
    fn new(hard_limit: usize) -> Self {
        Self {
            hard_limit: u64::try_from(hard_limit).unwrap_or(u64::MAX),
            scan: Scan::header(),
            in_text_message: false,
            utf8_tail: Vec::new(),
            scratch: Vec::new(),
        }
    }

    /// What a complete `header` starts: the state for its payload.
    fn start_frame(&mut self, header: &[u8]) -> Result<Scan, Violation> {
        let length = announced_len(header);
        if length > self.hard_limit {
            return Err(Violation::TooLarge);
        }
        let fin = header[0] & 0x80 != 0;
        let text = match header[0] & 0x0f {
            0x1 => {
                self.utf8_tail.clear();
                self.in_text_message = !fin;
                true
            }
            0x0 => {
                let text = self.in_text_message;
                self.in_text_message &= !fin;
                text
            }
            // Control frames may come between fragments; binary is never checked.
            _ => false,
        };
        let mut mask = [0u8; 4];
        if header[1] & 0x80 != 0 {
            mask.copy_from_slice(&header[header.len() - 4..]);
        }
        if length == 0 {
            self.end_frame(text, fin)?;
            return Ok(Scan::header());
        }
        Ok(Scan::Payload {
            remaining: length,
            text,
            mask,
            offset: 0,
            last: fin,
        })
    }

    /// Checks the next `bytes` of a text message (masked with `mask` from `offset`).
    fn check_text(&mut self, bytes: &[u8], mask: [u8; 4], offset: usize) -> Result<(), Violation> {
        self.scratch.clear();
        self.scratch.extend_from_slice(&self.utf8_tail);
        self.scratch.extend(
            bytes
                .iter()
                .enumerate()
                .map(|(i, b)| b ^ mask[(offset + i) % 4]),
        );
        self.utf8_tail.clear();
        match std::str::from_utf8(&self.scratch) {
            Ok(_) => Ok(()),
            // Cut off at the end: the rest may come with the next bytes.
            Err(e) if e.error_len().is_none() => {
                self.utf8_tail
                    .extend_from_slice(&self.scratch[e.valid_up_to()..]);
                Ok(())
            }
            Err(_) => Err(Violation::InvalidUtf8),
        }
    }

    /// A frame ended: a text message that ends with it must not end inside a sequence.
    fn end_frame(&mut self, text: bool, last: bool) -> Result<(), Violation> {
        if text && last && !self.utf8_tail.is_empty() {
            return Err(Violation::InvalidUtf8);
        }
        Ok(())
    }

    /// Scans the next bytes of the stream.
    fn feed(&mut self, mut chunk: &[u8]) -> Result<(), Violation> {
        while !chunk.is_empty() {
            match &mut self.scan {
                Scan::Header { bytes, have } => {
                    let needed = if *have < 2 {
                        2
                    } else {
                        header_len([bytes[0], bytes[1]])
                    };
                    let take = (needed - *have).min(chunk.len());
                    bytes[*have..*have + take].copy_from_slice(&chunk[..take]);
                    *have += take;
                    chunk = &chunk[take..];
                    if *have < 2 || *have < header_len([bytes[0], bytes[1]]) {
                        continue;
                    }
                    let header = *bytes;
                    let len = *have;
                    self.scan = self.start_frame(&header[..len])?;
                }
                Scan::Payload {
                    remaining,
                    text,
                    mask,
                    offset,
                    last,
                } => {
                    let take = usize::try_from(*remaining)
                        .unwrap_or(usize::MAX)
                        .min(chunk.len());
                    let (bytes, rest) = chunk.split_at(take);
                    chunk = rest;
                    *remaining -= take as u64;
                    let (text, mask, at, last, done) =
                        (*text, *mask, *offset, *last, *remaining == 0);
                    *offset += take;
                    if text {
                        self.check_text(bytes, mask, at)?;
                    }
                    if done {
                        self.end_frame(text, last)?;
                        self.scan = Scan::header();
                    }
                }
            }
        }
        Ok(())
    }
}

/// A WebSocket's inbound byte stream, ended early by a frame over the hard limit.
pub struct FrameGuard<S> {
    inner: S,
    scanner: Scanner,
    verdict: GuardVerdict,
    ended: bool,
}

impl<S> FrameGuard<S> {
    /// Guards `inner`: a frame announcing more than `hard_limit` payload bytes ends the stream
    /// with an error and records the violation in `verdict`.
    pub fn new(inner: S, hard_limit: usize, verdict: GuardVerdict) -> Self {
        Self {
            inner,
            scanner: Scanner::new(hard_limit),
            verdict,
            ended: false,
        }
    }
}

impl<S> Stream for FrameGuard<S>
where
    S: Stream<Item = Result<Bytes, PayloadError>> + Unpin,
{
    type Item = Result<Bytes, PayloadError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.ended {
            return Poll::Ready(None);
        }
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_next(cx) {
            Poll::Ready(Some(Ok(chunk))) => match this.scanner.feed(&chunk) {
                Ok(()) => Poll::Ready(Some(Ok(chunk))),
                Err(violation) => {
                    this.ended = true;
                    this.verdict.set(violation);
                    Poll::Ready(Some(Err(PayloadError::Io(io::Error::other(format!(
                        "{violation:?}"
                    ))))))
                }
            },
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A masked client frame with `len` payload bytes of `b'a'`.
    fn frame(opcode: u8, len: usize) -> Vec<u8> {
        let mut out = vec![0x80 | opcode];
        match len {
            0..=125 => out.push(0x80 | len as u8),
            126..=65535 => {
                out.push(0x80 | 126);
                out.extend_from_slice(&(len as u16).to_be_bytes());
            }
            _ => {
                out.push(0x80 | 127);
                out.extend_from_slice(&(len as u64).to_be_bytes());
            }
        }
        out.extend_from_slice(&[1, 2, 3, 4]);
        out.extend(std::iter::repeat_n(b'a', len));
        out
    }

    #[test]
    fn frames_up_to_the_limit_pass_in_any_chunking() {
        let mut stream = Vec::new();
        for len in [0, 5, 125, 126, 1000, 65535, 65536, 100_000] {
            stream.extend(frame(0x1, len));
        }
        for chunk_size in [1, 3, 7, 4096, stream.len()] {
            let mut scanner = Scanner::new(100_000);
            for chunk in stream.chunks(chunk_size) {
                assert_eq!(scanner.feed(chunk), Ok(()), "chunks of {chunk_size}");
            }
            assert!(matches!(scanner.scan, Scan::Header { have: 0, .. }));
        }
    }

    /// A masked client frame with `payload`, FIN set or not.
    fn text_frame(opcode: u8, fin: bool, payload: &[u8]) -> Vec<u8> {
        let mask = [0x37, 0xfa, 0x21, 0x3d];
        let mut out = vec![
            if fin { 0x80 } else { 0 } | opcode,
            0x80 | payload.len() as u8,
        ];
        out.extend_from_slice(&mask);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        out
    }

    fn scan_all(stream: &[u8], chunk_size: usize) -> Result<(), Violation> {
        let mut scanner = Scanner::new(1 << 20);
        stream
            .chunks(chunk_size)
            .try_for_each(|chunk| scanner.feed(chunk))
    }

    #[test]
    fn text_must_be_utf8_across_chunks_and_fragments() {
        let good = "héllo – 🙂 wörld".as_bytes();
        let mut fragmented = text_frame(0x1, false, &good[..7]);
        fragmented.extend(text_frame(0x9, true, b"ping"));
        fragmented.extend(text_frame(0x0, false, &good[7..13]));
        fragmented.extend(text_frame(0x0, true, &good[13..]));
        fragmented.extend(text_frame(0x2, true, &[0xff, 0xfe]));
        for chunk_size in [1, 2, 5, 64] {
            assert_eq!(scan_all(&text_frame(0x1, true, good), chunk_size), Ok(()));
            assert_eq!(
                scan_all(&fragmented, chunk_size),
                Ok(()),
                "binary is not text"
            );
        }
        let bad: [&[u8]; 4] = [
            &[0x80],
            &[b'{', 0xc0, 0xaf, b'}'],
            &[b'a', 0xe2, 0x82],
            &[0xed, 0xa0, 0x80],
        ];
        for payload in bad {
            for chunk_size in [1, 3, 64] {
                assert_eq!(
                    scan_all(&text_frame(0x1, true, payload), chunk_size),
                    Err(Violation::InvalidUtf8),
                    "{payload:?} in chunks of {chunk_size}"
                );
            }
        }
        // A sequence cut at the end of a fragmented message.
        let mut cut = text_frame(0x1, false, b"ok");
        cut.extend(text_frame(0x0, true, &[0xe2, 0x82]));
        assert_eq!(scan_all(&cut, 4), Err(Violation::InvalidUtf8));
    }

    #[test]
    fn an_announced_oversize_frame_is_refused_at_its_header() {
        let mut header = vec![0x81, 0x80 | 127];
        header.extend_from_slice(&(1u64 << 30).to_be_bytes());
        header.extend_from_slice(&[0, 0, 0, 0]);
        // Byte by byte: refused at the header's last byte, before any payload.
        let mut scanner = Scanner::new(256 * 1024);
        let (last, head) = header.split_last().unwrap_or((&0, &[]));
        for byte in head {
            assert_eq!(scanner.feed(&[*byte]), Ok(()));
        }
        assert_eq!(scanner.feed(&[*last]), Err(Violation::TooLarge));
        // After good frames, in one chunk.
        let mut stream = frame(0x1, 10);
        stream.extend(frame(0x2, 256 * 1024 + 1));
        assert_eq!(
            Scanner::new(256 * 1024).feed(&stream[..20]),
            Ok(()),
            "the good frame and a header prefix"
        );
        assert_eq!(
            Scanner::new(256 * 1024).feed(&stream),
            Err(Violation::TooLarge)
        );
    }
}
