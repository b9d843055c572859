//! One HTTP/1.1 exchange at a time on one connection to the model: the request written in one
//! vectored write, the response's head parsed with `httparse`, and its body read in place
//! (by `Content-Length`, chunked, or until the peer closes).
//!
//! WHY not hyper's client: hyper drives each connection from a task of its own and hands the
//! request, the response and every body chunk across channels between that task and the
//! caller. That was ~31,000 instructions per turn, plus ~8,700 per request in hyper_util's pool
//! (docs/performance-log.md, twenty-seventh and thirtieth sessions). Here the caller's own future
//! reads and writes the socket: one task, woken only by the socket. A chat completion needs
//! none of what hyper adds beyond that (no upgrades, no pipelining, no `Expect`).

use std::future::Future as _;
use std::io::{self, IoSlice};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use smallvec::SmallVec;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The longest response head accepted (status line and headers).
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// The most headers a response head may have.
const MAX_HEADERS: usize = 64;

/// The longest chunk-size or trailer line of a chunked body.
const MAX_LINE_BYTES: usize = 4 * 1024;

/// How much room a read asks for at least.
const READ_SIZE: usize = 16 * 1024;

/// The most of a finished answer's body that is still read (and dropped) to keep its
/// connection, before the connection's next request.
const MAX_UNREAD_BODY: usize = 64 * 1024;

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum ExchangeError {
    #[error("cannot connect to the model endpoint")]
    Connect(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("connection error")]
    Io(#[from] io::Error),
    #[error("the connection closed before the response was complete")]
    Closed,
    #[error("invalid response from the model endpoint: {0}")]
    Invalid(&'static str),
}

impl ExchangeError {
    /// Whether the connection failed before any of the response arrived: on a connection
    /// that was idle in the pool, the peer had most likely closed it meanwhile.
    pub(super) fn before_response(&self) -> bool {
        matches!(self, Self::Closed)
            || matches!(self, Self::Io(e) if is_peer_gone(e) || e.kind() == io::ErrorKind::UnexpectedEof)
    }
}

/// Whether `error` says the peer closed or reset the connection.
fn is_peer_gone(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionAborted
    )
}

/// A byte stream to the model endpoint (TCP, TLS over TCP, a proxy's tunnel).
pub(super) trait ByteStream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> ByteStream for T {}

/// An open connection and what it has read and not yet used.
pub(super) struct ModelConnection {
    io: Box<dyn ByteStream>,
    read: BytesMut,
    /// When it was last put back idle (`None`: never used yet).
    idle_since: Option<Instant>,
    /// The rest of the last answer's body, which its caller did not need (a stream read up to
    /// `[DONE]`, whose body's end came later): read and dropped before the next request.
    unread_body: Option<Framing>,
}

impl ModelConnection {
    pub(super) fn new(io: Box<dyn ByteStream>) -> Self {
        Self {
            io,
            read: BytesMut::new(),
            idle_since: None,
            unread_body: None,
        }
    }

    /// Whether it was used for an exchange before.
    pub(super) fn reused(&self) -> bool {
        self.idle_since.is_some()
    }

    /// Whether it has been idle for less than `limit` (or never idle).
    pub(super) fn idle_within(&self, limit: Duration) -> bool {
        self.idle_since.is_none_or(|since| since.elapsed() < limit)
    }

    /// Whether an idle connection can take another request: idle for less than `idle_limit`,
    /// the rest of its last body (if any) arrived and read, and neither closed by the peer nor
    /// holding bytes nobody asked for. Never waits.
    pub(super) fn still_usable(&mut self, idle_limit: Duration) -> bool {
        if !self.idle_within(idle_limit) {
            return false;
        }
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        if let Some(mut framing) = self.unread_body.take() {
            let mut read = 0;
            loop {
                match self.settle(&mut framing) {
                    Settled::Clean => break,
                    Settled::Broken => return false,
                    Settled::Pending if read > MAX_UNREAD_BODY => return false,
                    Settled::Pending => {}
                }
                self.read.reserve(READ_SIZE);
                let mut fill = std::pin::pin!(self.io.read_buf(&mut self.read));
                match fill.as_mut().poll(&mut cx) {
                    std::task::Poll::Ready(Ok(n)) if n > 0 => read += n,
                    // Not all there yet, closed, or failed.
                    _ => return false,
                }
            }
        }
        // One read attempt that must find nothing to read yet. A closed connection reads as
        // end of file (TLS: its close_notify) or as an error.
        let mut probe = [0u8; 1];
        let mut buf = tokio::io::ReadBuf::new(&mut probe);
        matches!(
            std::pin::Pin::new(&mut self.io).poll_read(&mut cx, &mut buf),
            std::task::Poll::Pending
        )
    }

    /// Send a request (`head` and `body`) and read its response's head.
    pub(super) async fn exchange(
        mut self,
        head: &[u8],
        body: &[Bytes],
    ) -> Result<ModelResponse, ExchangeError> {
        let head = match self.send(head, body).await {
            Ok(()) => self.read_head().await?,
            // A server may answer before it has read the whole request (a 413, a 401) and
            // close: the write fails, but its answer may be there to read, and it says more
            // than the write's error. The request went out incomplete, so the connection is
            // not kept. A dead socket's read does not wait.
            Err(write) if is_peer_gone(&write) => match self.read_head().await {
                Ok(mut head) => {
                    head.keep_alive = false;
                    head
                }
                Err(_) => return Err(write.into()),
            },
            Err(write) => return Err(write.into()),
        };
        Ok(ModelResponse {
            head,
            connection: self,
        })
    }

    /// Write `head` then `body`'s parts in as few writes as the socket takes, and flush.
    async fn send(&mut self, head: &[u8], body: &[Bytes]) -> io::Result<()> {
        let mut slices: SmallVec<[IoSlice<'_>; 64]> = SmallVec::with_capacity(body.len() + 1);
        slices.push(IoSlice::new(head));
        slices.extend(body.iter().map(|part| IoSlice::new(part)));
        let mut rest = &mut slices[..];
        while !rest.is_empty() {
            let written = self.io.write_vectored(rest).await?;
            if written == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            IoSlice::advance_slices(&mut rest, written);
        }
        self.io.flush().await
    }

    /// Read more bytes into the buffer; `Ok(0)` at the end of the stream.
    async fn fill(&mut self) -> io::Result<usize> {
        self.read.reserve(READ_SIZE);
        self.io.read_buf(&mut self.read).await
    }

    /// Read the response's head (skipping interim 1xx answers).
    async fn read_head(&mut self) -> Result<ResponseHead, ExchangeError> {
        loop {
            if let Some(head) = self.parse_head()? {
                if (100..200).contains(&head.status) {
                    continue;
                }
                return Ok(head);
            }
            if self.read.len() > MAX_HEAD_BYTES {
                return Err(ExchangeError::Invalid("response head too large"));
            }
            if self.fill().await? == 0 {
                // Nothing at all (the peer closed an idle connection) or part of a head.
                return Err(if self.read.is_empty() {
                    ExchangeError::Closed
                } else {
                    ExchangeError::Invalid("response head cut short")
                });
            }
        }
    }

    /// The head at the start of the buffer, taken out of it, if it is all there.
    fn parse_head(&mut self) -> Result<Option<ResponseHead>, ExchangeError> {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut response = httparse::Response::new(&mut headers);
        let len = match response.parse(&self.read) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => {
                return Err(ExchangeError::Invalid("too many response headers"));
            }
            Err(_) => return Err(ExchangeError::Invalid("malformed response head")),
        };
        let status = response.code.unwrap_or_default();
        let http11 = response.version == Some(1);
        let base = self.read.as_ptr() as usize;
        let mut fields = SmallVec::new();
        for header in response.headers.iter() {
            let name = header.name.as_ptr() as usize - base;
            let value = header.value.as_ptr() as usize - base;
            fields.push(Field {
                name: name..name + header.name.len(),
                value: value..value + header.value.len(),
            });
        }
        let raw = self.read.split_to(len).freeze();
        let mut head = ResponseHead {
            status,
            raw,
            fields,
            framing: Framing::Close,
            keep_alive: http11,
        };
        head.framing = head.framing()?;
        Ok(Some(head))
    }

    /// The next piece of the body that `framing` delimits, or `None` at its end.
    async fn next_chunk(&mut self, framing: &mut Framing) -> Result<Option<Bytes>, ExchangeError> {
        loop {
            if let Some(step) = self.decode(framing)? {
                return Ok(step);
            }
            if self.fill().await? == 0 {
                if matches!(framing, Framing::Close) {
                    *framing = Framing::Done;
                    return Ok(None);
                }
                return Err(ExchangeError::Closed);
            }
        }
    }

    /// One step of the body from what is buffered: `Some(Some(data))`, `Some(None)` at the
    /// body's end, `None` when more bytes must be read first.
    fn decode(&mut self, framing: &mut Framing) -> Result<Option<Option<Bytes>>, ExchangeError> {
        loop {
            match framing {
                Framing::Done => return Ok(Some(None)),
                Framing::Length(0) => *framing = Framing::Done,
                Framing::Length(left) | Framing::ChunkData(left) => {
                    if self.read.is_empty() {
                        return Ok(None);
                    }
                    let take = (*left).min(self.read.len() as u64);
                    *left -= take;
                    if let Framing::ChunkData(0) = framing {
                        *framing = Framing::ChunkEnd;
                    }
                    return Ok(Some(Some(self.read.split_to(take as usize).freeze())));
                }
                Framing::Close => {
                    if self.read.is_empty() {
                        return Ok(None);
                    }
                    return Ok(Some(Some(self.read.split().freeze())));
                }
                Framing::ChunkSize => {
                    let Some(line) = self.line()? else {
                        return Ok(None);
                    };
                    let size = chunk_size(&line)?;
                    *framing = if size == 0 {
                        Framing::Trailers
                    } else {
                        Framing::ChunkData(size)
                    };
                }
                Framing::ChunkEnd => {
                    let Some(line) = self.line()? else {
                        return Ok(None);
                    };
                    if !line.is_empty() {
                        return Err(ExchangeError::Invalid("chunk data longer than its size"));
                    }
                    *framing = Framing::ChunkSize;
                }
                Framing::Trailers => {
                    let Some(line) = self.line()? else {
                        return Ok(None);
                    };
                    if line.is_empty() {
                        *framing = Framing::Done;
                    }
                }
            }
        }
    }

    /// The next line of the buffer without its line end (CRLF or LF), taken out of it; `None`
    /// until a whole line is buffered.
    fn line(&mut self) -> Result<Option<Bytes>, ExchangeError> {
        let Some(end) = memchr::memchr(b'\n', &self.read) else {
            if self.read.len() > MAX_LINE_BYTES {
                return Err(ExchangeError::Invalid("chunk line too long"));
            }
            return Ok(None);
        };
        let mut line = self.read.split_to(end + 1);
        line.truncate(end);
        if line.last() == Some(&b'\r') {
            line.truncate(end - 1);
        }
        Ok(Some(line.freeze()))
    }

    /// Read the rest of a body from what is buffered, dropping it, without waiting.
    fn settle(&mut self, framing: &mut Framing) -> Settled {
        loop {
            match self.decode(framing) {
                Ok(Some(Some(_))) => {}
                Ok(Some(None)) if self.read.is_empty() => return Settled::Clean,
                // Bytes after the body's end: nothing a request asked for.
                Ok(Some(None)) | Err(_) => return Settled::Broken,
                Ok(None) => return Settled::Pending,
            }
        }
    }

    /// Mark the connection idle from now (on its way back to a pool).
    fn set_idle(&mut self) {
        self.idle_since = Some(Instant::now());
        if self.read.is_empty() && self.read.capacity() > 4 * READ_SIZE {
            // A large answer's buffer is not kept for the connection's idle life.
            self.read = BytesMut::new();
        }
    }
}

/// A response being read: its head, and the connection its body comes on.
pub(super) struct ModelResponse {
    connection: ModelConnection,
    /// Its `framing` is where reading the body stands.
    head: ResponseHead,
}

impl ModelResponse {
    pub(super) fn status(&self) -> u16 {
        self.head.status
    }

    /// The first value of the header `name` (ASCII case-insensitive), if it is text.
    pub(super) fn header(&self, name: &str) -> Option<&str> {
        self.head.header(name)
    }

    /// The next piece of the body, or `None` at its end.
    pub(super) async fn next_chunk(&mut self) -> Result<Option<Bytes>, ExchangeError> {
        self.connection.next_chunk(&mut self.head.framing).await
    }

    /// The next piece of the body if it is already read (a chunked body's next chunk that came
    /// in the same read as the last), else `None`: never waits.
    pub(super) fn next_buffered_chunk(&mut self) -> Result<Option<Bytes>, ExchangeError> {
        Ok(self.connection.decode(&mut self.head.framing)?.flatten())
    }

    /// The connection, idle, if it can take another request once the rest of this body (if
    /// its caller stopped early) is read; else `None`, and it closes.
    pub(super) fn into_idle(mut self) -> Option<ModelConnection> {
        if !self.head.keep_alive {
            return None;
        }
        match self.connection.settle(&mut self.head.framing) {
            Settled::Clean => {}
            Settled::Broken => return None,
            // Read at the connection's next use, when it has most likely arrived; a long rest
            // is not worth reading.
            Settled::Pending => match self.head.framing {
                Framing::Length(left) | Framing::ChunkData(left)
                    if left > MAX_UNREAD_BODY as u64 =>
                {
                    return None;
                }
                Framing::Close => return None,
                framing => self.connection.unread_body = Some(framing),
            },
        }
        self.connection.set_idle();
        Some(self.connection)
    }
}

/// Where the rest of a body stands after what is buffered was read.
#[derive(Debug, PartialEq, Eq)]
enum Settled {
    /// The body ended, and nothing follows it.
    Clean,
    /// More of it is to come.
    Pending,
    /// It cannot be finished (malformed), or bytes follow its end.
    Broken,
}

/// How a response's body is delimited, and where reading it stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Framing {
    /// This many bytes are left (`Content-Length`).
    Length(u64),
    /// Until the peer closes the connection.
    Close,
    /// Chunked: a chunk-size line is next.
    ChunkSize,
    /// Chunked: this many bytes of the current chunk are left.
    ChunkData(u64),
    /// Chunked: the line end after a chunk's data is next.
    ChunkEnd,
    /// Chunked: trailer lines, up to an empty one.
    Trailers,
    /// The whole body has been read.
    Done,
}

/// The size in a chunk-size line (extensions after `;` ignored).
fn chunk_size(line: &[u8]) -> Result<u64, ExchangeError> {
    let digits = line
        .iter()
        .position(|&b| b == b';')
        .map_or(line, |at| &line[..at]);
    let digits = digits.trim_ascii();
    if digits.is_empty() || digits.len() > 15 {
        return Err(ExchangeError::Invalid("malformed chunk size"));
    }
    digits.iter().try_fold(0u64, |size, &b| {
        let digit = (b as char)
            .to_digit(16)
            .ok_or(ExchangeError::Invalid("malformed chunk size"))?;
        Ok(size * 16 + u64::from(digit))
    })
}

/// Where a header's name and value lie in the head's bytes.
#[derive(Clone, Debug)]
struct Field {
    name: std::ops::Range<usize>,
    value: std::ops::Range<usize>,
}

/// A response's status and headers.
#[derive(Debug)]
pub(super) struct ResponseHead {
    status: u16,
    raw: Bytes,
    fields: SmallVec<[Field; 12]>,
    framing: Framing,
    /// Whether the connection can carry another request after this body.
    keep_alive: bool,
}

impl ResponseHead {
    /// Every value of the header `name` (ASCII case-insensitive), in order.
    fn values<'a, 'n>(&'a self, name: &'n str) -> impl Iterator<Item = &'a [u8]> + use<'a, 'n> {
        self.fields
            .iter()
            .filter(move |field| self.raw[field.name.clone()].eq_ignore_ascii_case(name.as_bytes()))
            .map(|field| &self.raw[field.value.clone()])
    }

    /// The first value of the header `name`, if it is text.
    pub(super) fn header(&self, name: &str) -> Option<&str> {
        self.values(name)
            .next()
            .and_then(|value| std::str::from_utf8(value).ok())
    }

    /// Whether a comma-separated header `name` lists `token`.
    fn lists(&self, name: &str, token: &str) -> bool {
        self.values(name).any(|value| {
            value
                .split(|&b| b == b',')
                .any(|item| item.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
        })
    }

    /// How the body is delimited (RFC 9112 §6.3), and whether the connection stays open.
    fn framing(&mut self) -> Result<Framing, ExchangeError> {
        if self.lists("connection", "close") {
            self.keep_alive = false;
        }
        if self.status == 204 || self.status == 304 {
            return Ok(Framing::Done);
        }
        if self.values("transfer-encoding").next().is_some() {
            let chunked_last = self
                .values("transfer-encoding")
                .last()
                .and_then(|value| value.rsplit(|&b| b == b',').next())
                .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
            if chunked_last && self.values("content-length").next().is_none() {
                return Ok(Framing::ChunkSize);
            }
            // Chunked under another coding, or a length beside it: read to the end, and close.
            self.keep_alive = false;
            return Ok(if chunked_last {
                Framing::ChunkSize
            } else {
                Framing::Close
            });
        }
        // Several values (or a list) must all agree.
        let length = {
            let mut lengths = self.values("content-length").flat_map(|value| {
                value.split(|&b| b == b',').map(|item| {
                    std::str::from_utf8(item.trim_ascii())
                        .ok()?
                        .parse::<u64>()
                        .ok()
                })
            });
            match lengths.next() {
                None => None,
                Some(Some(length)) if lengths.all(|other| other == Some(length)) => Some(length),
                Some(_) => return Err(ExchangeError::Invalid("malformed content-length")),
            }
        };
        match length {
            Some(length) => Ok(Framing::Length(length)),
            None => {
                self.keep_alive = false;
                Ok(Framing::Close)
            }
        }
    }
}

/// The part of a request head that changes per request: its length, the trace headers, and
/// the blank line that ends the head.
pub(super) fn head_tail(out: &mut Vec<u8>, content_length: u64, extra: &[(&str, String)]) {
    out.extend_from_slice(b"content-length: ");
    out.extend_from_slice(itoa::Buffer::new().format(content_length).as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in extra {
        // Only values a header can carry (no line ends), as `HeaderValue` would check.
        if value
            .bytes()
            .all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
        {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
impl ModelConnection {
    /// How many read bytes are not used yet.
    fn buffered(&self) -> usize {
        self.read.len()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt, duplex};

    use super::*;

    /// A connection whose peer writes `response` split at `splits`, then closes.
    async fn exchange(response: &[u8], splits: &[usize]) -> (ResponseHead, Vec<u8>, Framing) {
        let (client, mut server) = duplex(1 << 20);
        let mut connection = ModelConnection::new(Box::new(client));
        let response = response.to_vec();
        let splits = splits.to_vec();
        let writer = tokio::spawn(async move {
            let mut at = 0;
            for split in splits.into_iter().chain([response.len()]) {
                let split = split.clamp(at, response.len());
                server.write_all(&response[at..split]).await.unwrap();
                server.flush().await.unwrap();
                tokio::task::yield_now().await;
                at = split;
            }
            // Closed: a body delimited by the close ends here.
            drop(server);
        });
        let mut head = connection.read_head().await.unwrap();
        let mut body = Vec::new();
        while let Some(data) = connection.next_chunk(&mut head.framing).await.unwrap() {
            body.extend_from_slice(&data);
        }
        writer.await.unwrap();
        assert_eq!(connection.buffered(), 0);
        let framing = head.framing;
        (head, body, framing)
    }

    const CHUNKED: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\
        Transfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nx-t: 1\r\n\r\n";

    #[tokio::test]
    async fn a_chunked_body_is_decoded_at_every_split_point() {
        for at in 0..CHUNKED.len() {
            let (head, body, framing) = exchange(CHUNKED, &[at]).await;
            assert_eq!(head.status, 200);
            assert_eq!(head.header("content-type"), Some("text/event-stream"));
            assert!(head.keep_alive);
            assert_eq!(body, b"hello, world", "split at {at}");
            assert_eq!(framing, Framing::Done);
        }
        // A byte at a time.
        let every: Vec<usize> = (1..CHUNKED.len()).collect();
        let (_, body, _) = exchange(CHUNKED, &every).await;
        assert_eq!(body, b"hello, world");
    }

    #[tokio::test]
    async fn a_length_delimited_body_ends_at_its_length_and_keeps_the_connection() {
        let response = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nretry-after: 3\r\n\r\nhello";
        for at in 0..response.len() {
            let (head, body, framing) = exchange(response, &[at]).await;
            assert_eq!(body, b"hello");
            assert_eq!(framing, Framing::Done);
            assert!(head.keep_alive);
            assert_eq!(head.header("Retry-After"), Some("3"));
            assert_eq!(head.header("x-missing"), None);
        }
    }

    #[tokio::test]
    async fn a_body_without_length_runs_to_the_close_and_the_connection_is_not_kept() {
        let (head, body, _) = exchange(b"HTTP/1.1 200 OK\r\n\r\nall of it", &[20]).await;
        assert_eq!(body, b"all of it");
        assert!(!head.keep_alive);
        let (head, _, _) = exchange(
            b"HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\ncontent-length: 0\r\n\r\n",
            &[],
        )
        .await;
        assert!(!head.keep_alive, "connection: close");
        let (head, _, _) = exchange(b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n", &[]).await;
        assert!(!head.keep_alive, "HTTP/1.0");
    }

    #[tokio::test]
    async fn interim_answers_are_skipped() {
        let (head, body, _) = exchange(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok",
            &[10, 30],
        )
        .await;
        assert_eq!(head.status, 201);
        assert_eq!(body, b"ok");
    }

    /// The error reading `response` ends with.
    async fn failure(response: &'static [u8]) -> ExchangeError {
        let (client, mut server) = duplex(1 << 20);
        let mut connection = ModelConnection::new(Box::new(client));
        server.write_all(response).await.unwrap();
        drop(server);
        let mut head = match connection.read_head().await {
            Ok(head) => head,
            Err(e) => return e,
        };
        loop {
            match connection.next_chunk(&mut head.framing).await {
                Ok(Some(_)) => {}
                Ok(None) => panic!("{response:?} read to its end"),
                Err(e) => return e,
            }
        }
    }

    #[tokio::test]
    async fn malformed_and_cut_responses_are_errors() {
        for (response, expected) in [
            (&b"garbage\r\n\r\n"[..], "malformed response head"),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n",
                "content-length",
            ),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n",
                "content-length",
            ),
            (
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
                "chunk size",
            ),
            (
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nabc\r\n",
                "longer than its size",
            ),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort",
                "closed before",
            ),
            (
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel",
                "closed before",
            ),
            (b"HTTP/1.1 200 OK\r\ncontent-le", "head cut short"),
            (b"", "closed before"),
        ] {
            let error = failure(response).await.to_string();
            assert!(error.contains(expected), "{response:?}: {error}");
        }
    }

    #[tokio::test]
    async fn an_idle_connection_the_peer_closed_is_not_usable() {
        let (client, server) = duplex(64);
        let mut connection = ModelConnection::new(Box::new(client));
        assert!(connection.still_usable(Duration::from_secs(60)));
        connection.set_idle();
        assert!(connection.still_usable(Duration::from_secs(60)));
        assert!(
            !connection.still_usable(Duration::ZERO),
            "idle longer than the limit"
        );
        drop(server);
        assert!(!connection.still_usable(Duration::from_secs(60)));
    }

    /// A connection whose peer has sent `first`, past the head read from it, with the first
    /// piece of its body read (as a stream stops at `[DONE]`), put back idle.
    async fn stopped_early(first: &[u8]) -> (Option<ModelConnection>, tokio::io::DuplexStream) {
        let (client, mut server) = duplex(1 << 16);
        let mut connection = ModelConnection::new(Box::new(client));
        server.write_all(first).await.unwrap();
        let head = connection.read_head().await.unwrap();
        let mut response = ModelResponse { head, connection };
        assert!(response.next_chunk().await.unwrap().is_some());
        (response.into_idle(), server)
    }

    #[tokio::test]
    async fn a_body_its_caller_stopped_reading_is_finished_before_the_next_request() {
        // All of it already read: reusable at once.
        let (connection, _server) = stopped_early(CHUNKED).await;
        let mut connection = connection.expect("kept");
        assert!(connection.still_usable(Duration::from_secs(60)));

        // Its end arrives later, before the next request: read then, and reusable.
        let cut = CHUNKED.len() - 9;
        let (connection, mut server) = stopped_early(&CHUNKED[..cut]).await;
        let mut connection = connection.expect("kept, its end to come");
        server.write_all(&CHUNKED[cut..]).await.unwrap();
        assert!(connection.still_usable(Duration::from_secs(60)));
        assert_eq!(connection.buffered(), 0);

        // Its end has not arrived at the next request: not used.
        let (connection, _server) = stopped_early(&CHUNKED[..cut]).await;
        assert!(
            !connection
                .expect("kept")
                .still_usable(Duration::from_secs(60))
        );

        // Bytes after its end: not used.
        let (connection, mut server) = stopped_early(&CHUNKED[..cut]).await;
        let mut connection = connection.expect("kept");
        server.write_all(&CHUNKED[cut..]).await.unwrap();
        server.write_all(b"HTTP/1.1 200 OK\r\n").await.unwrap();
        assert!(!connection.still_usable(Duration::from_secs(60)));

        // The peer closed before its end: not used.
        let (connection, server) = stopped_early(&CHUNKED[..cut]).await;
        drop(server);
        assert!(
            !connection
                .expect("kept")
                .still_usable(Duration::from_secs(60))
        );

        // Too much of it left to be worth reading: closed at once.
        let (connection, _server) =
            stopped_early(b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\nab").await;
        assert!(connection.is_none());
        // Delimited by the close, or `connection: close`: closed at once.
        let (connection, _server) = stopped_early(b"HTTP/1.1 200 OK\r\n\r\nab").await;
        assert!(connection.is_none());
        let (connection, _server) =
            stopped_early(b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nab")
                .await;
        assert!(connection.is_none());
    }

    #[tokio::test]
    async fn a_request_goes_out_whole_in_its_parts() {
        let (client, mut server) = duplex(1 << 16);
        let mut connection = ModelConnection::new(Box::new(client));
        let mut head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n".to_vec();
        head_tail(
            &mut head,
            11,
            &[
                ("traceparent", "00-ab-cd-01".to_owned()),
                ("bad", "a\r\nb".to_owned()),
            ],
        );
        let body = [
            Bytes::from_static(b"{\"a\":"),
            Bytes::from_static(b"[1,2]}"),
        ];
        connection.send(&head, &body).await.unwrap();
        drop(connection);
        let mut seen = Vec::new();
        server.read_to_end(&mut seen).await.unwrap();
        assert_eq!(
            String::from_utf8(seen).unwrap(),
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 11\r\n\
             traceparent: 00-ab-cd-01\r\n\r\n{\"a\":[1,2]}"
        );
    }

    #[tokio::test]
    async fn an_answer_sent_before_the_request_was_read_whole_is_the_response() {
        // The peer reads the head, answers and goes away with most of the body unread.
        let (client, mut server) = duplex(256);
        let connection = ModelConnection::new(Box::new(client));
        let peer = tokio::spawn(async move {
            let mut start = [0u8; 64];
            server.read_exact(&mut start).await.unwrap();
            server
                .write_all(b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 8\r\n\r\ntoo long")
                .await
                .unwrap();
        });
        let body = [Bytes::from(vec![b'x'; 1 << 16])];
        let mut response = connection
            .exchange(b"POST / HTTP/1.1\r\ncontent-length: 65536\r\n\r\n", &body)
            .await
            .expect("the answer, not the write's error");
        peer.await.unwrap();
        assert_eq!(response.status(), 413);
        assert_eq!(
            &response.next_chunk().await.unwrap().unwrap()[..],
            b"too long"
        );
        assert!(response.next_chunk().await.unwrap().is_none());
        assert!(
            response.into_idle().is_none(),
            "the request went out cut short"
        );

        // Gone without an answer: the write's error.
        let (client, mut server) = duplex(256);
        let connection = ModelConnection::new(Box::new(client));
        let peer = tokio::spawn(async move {
            let mut start = [0u8; 64];
            server.read_exact(&mut start).await.unwrap();
        });
        let error = connection
            .exchange(b"POST / HTTP/1.1\r\ncontent-length: 65536\r\n\r\n", &body)
            .await
            .err()
            .expect("no answer");
        peer.await.unwrap();
        assert!(
            matches!(&error, ExchangeError::Io(e) if e.kind() == io::ErrorKind::BrokenPipe),
            "{error:?}"
        );
    }
}
