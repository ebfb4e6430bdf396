//! The PostgreSQL connection loop, with every frontend message checked before pgwire decodes it.
//!
//! pgwire's decoders read a message's fields from the whole read buffer, not from the frame its
//! length announces: a `Parse` or `Bind` whose length lies reads into the next message (and
//! panics at the buffer's end), a `Query` with bytes after its string leaves them to be read as
//! the next message. So the bytes of a connection pass through [`Checked`], which hands pgwire
//! only whole frames whose fields fill them exactly (the grammar of each message type, as
//! pgwire reads it). A frame that does not is answered with FATAL 08P01 naming the fault, and
//! the connection is closed; nothing of it reaches a decoder. TLS negotiation stays pgwire's
//! (`negotiate_tls`, which reads only the fixed-size `SSLRequest` / `GSSENCRequest`); the loop
//! after it is pgwire's `process_socket` loop with that check and that answer added.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::BytesMut;
use futures::{SinkExt, StreamExt};
use pgwire::api::{ClientInfo, ErrorHandler, PgWireConnectionState, PgWireServerHandlers};
use pgwire::error::{ErrorInfo, PgWireError};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use pgwire::tokio::server::{negotiate_tls, process_error, process_message};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::codec::{Framed, FramedParts};

/// A client has this long from connecting to finishing start-up and authentication.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// The largest message taken after start-up. SQL text and bound parameters of a read-only
/// database stay far below it; a client cannot make the server hold more for one message.
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// The largest start-up message (pgwire's own limit).
const MAX_STARTUP_BYTES: usize = 10_000;

const SSL_REQUEST: i32 = 80_877_103;
const GSSENC_REQUEST: i32 = 80_877_104;
const CANCEL_REQUEST: i32 = 80_877_102;

/// Runs one connection to its end: TLS negotiation, start-up, then messages until the client
/// leaves, a FATAL error, or a malformed message.
pub async fn serve_connection<H: PgWireServerHandlers>(
    socket: TcpStream,
    tls: Option<pgwire::tokio::TlsAcceptor>,
    handlers: H,
) -> io::Result<()> {
    let startup_deadline = tokio::time::sleep(STARTUP_TIMEOUT);
    tokio::pin!(startup_deadline);
    let negotiated = tokio::select! {
        _ = &mut startup_deadline => return Ok(()),
        negotiated = negotiate_tls(socket, tls) => negotiated?,
    };
    // `None`: direct TLS asked of a server without TLS
    let Some(negotiated) = negotiated else {
        return Ok(());
    };
    // bytes pgwire read past the negotiation go through the check like every later byte
    let old = negotiated.into_parts();
    let checked = Checked::new(old.io, old.read_buf);
    let mut parts = FramedParts::new(checked, old.codec);
    parts.write_buf = old.write_buf;
    let mut socket = Framed::from_parts(parts);

    let startup_handler = handlers.startup_handler();
    let simple = handlers.simple_query_handler();
    let extended = handlers.extended_query_handler();
    let copy = handlers.copy_handler();
    let cancel = handlers.cancel_handler();
    let errors = handlers.error_handler();
    loop {
        let next = if matches!(
            socket.state(),
            PgWireConnectionState::AwaitingStartup
                | PgWireConnectionState::AuthenticationInProgress
        ) {
            tokio::select! {
                _ = &mut startup_deadline => None,
                next = socket.next() => next,
            }
        } else {
            socket.next().await
        };
        let message = match next {
            None => break,
            Some(Ok(message)) => message,
            Some(Err(e)) => {
                refuse_message(&mut socket, e).await;
                break;
            }
        };
        // the client is leaving; some clients wait for the server to close first
        if matches!(message, PgWireFrontendMessage::Terminate(_)) {
            break;
        }
        let extended_query = match socket.state() {
            PgWireConnectionState::CopyInProgress(extended) => extended,
            _ => message.is_extended_query(),
        };
        // `process_message` closes a cancel request's connection
        let is_cancel = matches!(message, PgWireFrontendMessage::CancelRequest(_));
        if let Err(mut e) = process_message(
            message,
            &mut socket,
            startup_handler.clone(),
            simple.clone(),
            extended.clone(),
            copy.clone(),
            cancel.clone(),
        )
        .await
        {
            errors.on_error(&socket, &mut e);
            let fatal = e.is_fatal();
            process_error(&mut socket, e, extended_query).await?;
            if fatal {
                break;
            }
        }
        if is_cancel {
            break;
        }
    }
    Ok(())
}

/// Answers a message that could not be read (malformed, or a type pgwire does not know) with
/// FATAL 08P01 naming the fault, as PostgreSQL does; a connection that broke gets nothing.
async fn refuse_message<S, C>(socket: &mut Framed<S, C>, e: PgWireError)
where
    S: AsyncRead + AsyncWrite + Unpin,
    C: tokio_util::codec::Encoder<PgWireBackendMessage>,
{
    let detail = match &e {
        PgWireError::IoError(io) => {
            match io.get_ref().and_then(|i| i.downcast_ref::<Malformed>()) {
                Some(m) => m.0.clone(),
                None => return,
            }
        }
        other => other.to_string(),
    };
    tracing::debug!(%detail, "PostgreSQL message refused");
    let info = ErrorInfo::new(
        "FATAL".into(),
        "08P01".into(),
        format!("invalid frontend message: {detail}"),
    );
    let send = socket.send(PgWireBackendMessage::ErrorResponse(info.into()));
    let _ = tokio::time::timeout(Duration::from_secs(5), send).await;
}

/// Why a frame was refused (carried inside the `io::Error` the read returns).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub String);

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Malformed {}

/// A stream that yields only whole, well-formed frontend frames (see the module comment).
pub struct Checked<S> {
    io: S,
    frames: FrameCheck,
    /// Read, not yet a whole frame.
    pending: BytesMut,
    /// Whole frames that passed, not yet handed on.
    passed: BytesMut,
    fault: Option<Malformed>,
    eof: bool,
}

impl<S> Checked<S> {
    /// `already` holds bytes read before the stream was wrapped; they are checked first.
    pub fn new(io: S, already: BytesMut) -> Self {
        Checked {
            io,
            frames: FrameCheck::default(),
            pending: already,
            passed: BytesMut::new(),
            fault: None,
            eof: false,
        }
    }

    /// Moves every whole frame at the front of `pending` that passes to `passed`; stops at the
    /// first that does not, recording why.
    fn cut_frames(&mut self) {
        while self.fault.is_none() {
            match self.frames.next_frame(&self.pending) {
                Ok(Some(n)) => self.passed.unsplit(self.pending.split_to(n)),
                Ok(None) => break,
                Err(m) => self.fault = Some(m),
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Checked<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            this.cut_frames();
            if !this.passed.is_empty() {
                let n = this.passed.len().min(out.remaining());
                out.put_slice(&this.passed.split_to(n));
                return Poll::Ready(Ok(()));
            }
            if let Some(m) = &this.fault {
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, m.clone())));
            }
            if this.eof {
                // a frame cut short by the client's leaving is dropped with the connection
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 8192];
            let mut buf = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.io).poll_read(cx, &mut buf))?;
            if buf.filled().is_empty() {
                this.eof = true;
            } else {
                this.pending.extend_from_slice(buf.filled());
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Checked<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Frames of the frontend stream: untyped (length first) until the start-up message, typed
/// (a type byte, then the length) after it.
#[derive(Debug, Default)]
pub struct FrameCheck {
    typed: bool,
}

impl FrameCheck {
    /// The length of the whole frame at the front of `buf` when it is well formed; `None` while
    /// it is incomplete; the fault when it is not well formed (or can never be: a length that
    /// lies about its own size, or one over the limit, is refused before its bytes arrive).
    pub fn next_frame(&mut self, buf: &[u8]) -> Result<Option<usize>, Malformed> {
        if self.typed {
            typed_frame(buf)
        } else {
            let frame = startup_frame(buf)?;
            if let Some((n, code)) = frame {
                if !matches!(code, SSL_REQUEST | GSSENC_REQUEST) {
                    self.typed = true;
                }
                return Ok(Some(n));
            }
            Ok(None)
        }
    }
}

fn be_i32(b: &[u8]) -> i32 {
    i32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// A start-up phase frame: `SSLRequest`, `GSSENCRequest`, `CancelRequest` or the start-up
/// message (protocol version, then name/value string pairs ending in an empty name).
fn startup_frame(buf: &[u8]) -> Result<Option<(usize, i32)>, Malformed> {
    if buf.len() < 8 {
        return Ok(None);
    }
    let len = be_i32(buf);
    if len < 8 || len as usize > MAX_STARTUP_BYTES {
        return Err(Malformed(format!(
            "a start-up message of {len} bytes (8 to {MAX_STARTUP_BYTES} are valid)"
        )));
    }
    let len = len as usize;
    if buf.len() < len {
        return Ok(None);
    }
    let code = be_i32(&buf[4..8]);
    let body = &buf[8..len];
    match code {
        SSL_REQUEST | GSSENC_REQUEST if len != 8 => Err(Malformed(format!(
            "an encryption request of {len} bytes (it has 8)"
        ))),
        CANCEL_REQUEST if len < 16 => Err(Malformed(format!(
            "a cancel request of {len} bytes (it has 16 or more)"
        ))),
        SSL_REQUEST | GSSENC_REQUEST | CANCEL_REQUEST => Ok(Some((len, code))),
        _ => {
            let mut r = Fields::new(body, "start-up message");
            loop {
                let name = r.cstr()?;
                if name.is_empty() {
                    break;
                }
                r.cstr()?;
            }
            r.end()?;
            Ok(Some((len, code)))
        }
    }
}

/// A typed frame: checks the length, then the fields of the message types whose pgwire
/// decoder reads fields (others are taken whole, or refused by pgwire by their type).
fn typed_frame(buf: &[u8]) -> Result<Option<usize>, Malformed> {
    if buf.len() < 5 {
        return Ok(None);
    }
    let tag = buf[0];
    let len = be_i32(&buf[1..5]);
    let name = message_name(tag);
    if len < 4 {
        return Err(Malformed(format!(
            "{name} claims a length of {len}, under the 4 bytes of the length itself"
        )));
    }
    let len = len as usize;
    if len > MAX_MESSAGE_BYTES {
        return Err(Malformed(format!(
            "{name} of {len} bytes, over the {MAX_MESSAGE_BYTES} bytes a message may have"
        )));
    }
    if buf.len() < 1 + len {
        return Ok(None);
    }
    let mut r = Fields::new(&buf[5..1 + len], name);
    match tag {
        // Query, CopyFail: a string
        b'Q' | b'f' => {
            r.cstr()?;
        }
        // Parse: statement name, query, parameter type OIDs
        b'P' => {
            r.cstr()?;
            r.cstr()?;
            let n = r.u16()?;
            r.take(4 * n as usize, "parameter type OIDs")?;
        }
        // Bind: portal, statement, parameter formats, parameters, result formats
        b'B' => {
            r.cstr()?;
            r.cstr()?;
            let formats = r.u16()?;
            r.take(2 * formats as usize, "parameter format codes")?;
            let params = r.u16()?;
            for _ in 0..params {
                let size = r.i32()?;
                if size < -1 {
                    return Err(Malformed(format!("{name}: a parameter of length {size}")));
                }
                if size > 0 {
                    r.take(size as usize, "a parameter value")?;
                }
            }
            let results = r.u16()?;
            r.take(2 * results as usize, "result format codes")?;
        }
        // Close, Describe: 'S' or 'P', then a name
        b'C' | b'D' => {
            r.take(1, "the target type")?;
            r.cstr()?;
        }
        // Execute: portal, row limit
        b'E' => {
            r.cstr()?;
            r.i32()?;
        }
        // Flush, Sync, Terminate, CopyDone: nothing
        b'H' | b'S' | b'X' | b'c' => {}
        // CopyData, the password family (read from its own frame), unknown types: whole
        _ => return Ok(Some(1 + len)),
    }
    r.end()?;
    Ok(Some(1 + len))
}

fn message_name(tag: u8) -> &'static str {
    match tag {
        b'Q' => "Query",
        b'P' => "Parse",
        b'B' => "Bind",
        b'C' => "Close",
        b'D' => "Describe",
        b'E' => "Execute",
        b'H' => "Flush",
        b'S' => "Sync",
        b'X' => "Terminate",
        b'd' => "CopyData",
        b'c' => "CopyDone",
        b'f' => "CopyFail",
        b'p' => "a password message",
        _ => "a message",
    }
}

/// Reads a frame's fields, each within the frame.
pub struct Fields<'a> {
    rest: &'a [u8],
    name: &'a str,
}

impl<'a> Fields<'a> {
    pub fn new(body: &'a [u8], name: &'a str) -> Self {
        Fields { rest: body, name }
    }

    pub fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], Malformed> {
        if self.rest.len() < n {
            return Err(Malformed(format!(
                "{}: {what} needs {n} bytes, {} are left in the message",
                self.name,
                self.rest.len()
            )));
        }
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(head)
    }

    /// A NUL-terminated string, without its NUL.
    pub fn cstr(&mut self) -> Result<&'a [u8], Malformed> {
        let Some(end) = self.rest.iter().position(|&b| b == 0) else {
            return Err(Malformed(format!(
                "{}: a string runs past the end of the message",
                self.name
            )));
        };
        let s = &self.rest[..end];
        self.rest = &self.rest[end + 1..];
        Ok(s)
    }

    pub fn u16(&mut self) -> Result<u16, Malformed> {
        let b = self.take(2, "a count")?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    pub fn i32(&mut self) -> Result<i32, Malformed> {
        Ok(be_i32(self.take(4, "a 4-byte integer")?))
    }

    /// Everything was read.
    pub fn end(&self) -> Result<(), Malformed> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(Malformed(format!(
                "{}: {} bytes after its last field",
                self.name,
                self.rest.len()
            )))
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use pgwire::messages::DecodeContext;

    fn frame(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut f = vec![tag];
        f.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
        f.extend_from_slice(body);
        f
    }

    /// A start-up message (protocol 3.0, a user and the `weft` database).
    pub(crate) fn startup() -> Vec<u8> {
        let mut body = 196_608i32.to_be_bytes().to_vec();
        body.extend_from_slice(b"user\0u\0database\0weft\0\0");
        let mut f = ((body.len() + 4) as i32).to_be_bytes().to_vec();
        f.extend_from_slice(&body);
        f
    }

    /// Runs `bytes` through the check, then hands what passed to pgwire's decoder, message by
    /// message, as the connection would: the count of decoded messages, and the fault if any.
    pub(crate) fn through(bytes: &[u8]) -> (usize, Option<Malformed>) {
        // the stream's own check, on bytes already read
        let mut checked = Checked::new((), BytesMut::from(bytes));
        checked.cut_frames();
        let (mut passed, fault) = (checked.passed, checked.fault);
        // the state after TLS negotiation: start-up next
        let mut ctx = DecodeContext::default();
        ctx.awaiting_frontend_ssl = false;
        let mut decoded = 0;
        while !passed.is_empty() {
            let before = passed.len();
            match PgWireFrontendMessage::decode(&mut passed, &ctx) {
                Ok(Some(m)) => {
                    assert!(passed.len() < before, "pgwire decoded nothing");
                    decoded += 1;
                    if matches!(m, PgWireFrontendMessage::Startup(_)) {
                        ctx.awaiting_frontend_startup = false;
                    }
                    if let PgWireFrontendMessage::PasswordMessageFamily(p) = m {
                        let _ = crate::sql::scram::sasl_initial(p);
                    }
                }
                Ok(None) => panic!("a frame that passed is incomplete to pgwire"),
                // pgwire refuses it (an unknown type, a start-up of another protocol)
                Err(_) => break,
            }
        }
        (decoded, fault)
    }

    #[test]
    fn well_formed_messages_pass_whole_and_decode_one_for_one() {
        let mut bytes = startup();
        bytes.extend(frame(b'Q', b"SELECT 1\0"));
        let mut parse = b"s1\0SELECT $1\0".to_vec();
        parse.extend_from_slice(&1u16.to_be_bytes());
        parse.extend_from_slice(&23u32.to_be_bytes());
        bytes.extend(frame(b'P', &parse));
        let mut bind = b"\0s1\0".to_vec();
        bind.extend_from_slice(&0u16.to_be_bytes());
        bind.extend_from_slice(&2u16.to_be_bytes());
        bind.extend_from_slice(&1i32.to_be_bytes());
        bind.push(b'7');
        bind.extend_from_slice(&(-1i32).to_be_bytes());
        bind.extend_from_slice(&0u16.to_be_bytes());
        bytes.extend(frame(b'B', &bind));
        bytes.extend(frame(b'D', b"P\0"));
        let mut exec = b"\0".to_vec();
        exec.extend_from_slice(&0i32.to_be_bytes());
        bytes.extend(frame(b'E', &exec));
        bytes.extend(frame(b'S', b""));
        bytes.extend(frame(b'X', b""));
        assert_eq!(through(&bytes), (8, None));
    }

    #[test]
    fn lying_lengths_and_trailing_bytes_are_refused_naming_the_message() {
        let mut bytes = startup();
        // a Parse whose count announces a type OID the frame does not hold
        let mut parse = b"\0SELECT 1\0".to_vec();
        parse.extend_from_slice(&1u16.to_be_bytes());
        bytes.extend(frame(b'P', &parse));
        bytes.extend(frame(b'Q', b"SELECT 2\0"));
        let (decoded, fault) = through(&bytes);
        assert_eq!(decoded, 1, "the start-up only");
        let fault = fault.unwrap().0;
        assert!(
            fault.contains("Parse") && fault.contains("parameter type OIDs"),
            "{fault}"
        );

        let mut bytes = startup();
        bytes.extend(frame(b'Q', b"SELECT 1\0Q\0\0\0\x04"));
        let fault = through(&bytes).1.unwrap().0;
        assert!(fault.contains("bytes after its last field"), "{fault}");

        let mut bytes = startup();
        bytes.extend([b'S', 0, 0, 0, 2]);
        let fault = through(&bytes).1.unwrap().0;
        assert!(fault.contains("under the 4 bytes"), "{fault}");

        let mut bytes = startup();
        bytes.extend([b'Q', 0x7f, 0, 0, 0]);
        let fault = through(&bytes).1.unwrap().0;
        assert!(fault.contains("over the"), "{fault}");

        let mut unterminated = 196_608i32.to_be_bytes().to_vec();
        unterminated.extend_from_slice(b"user\0u");
        let mut bytes = ((unterminated.len() + 4) as i32).to_be_bytes().to_vec();
        bytes.extend(unterminated);
        let fault = through(&bytes).1.unwrap().0;
        assert!(fault.contains("start-up message"), "{fault}");
    }

    #[test]
    fn a_frame_arriving_in_pieces_passes_once_whole() {
        let mut check = FrameCheck::default();
        let s = startup();
        for cut in 0..s.len() {
            assert_eq!(check.next_frame(&s[..cut]), Ok(None), "cut at {cut}");
        }
        assert_eq!(check.next_frame(&s), Ok(Some(s.len())));
        let q = frame(b'Q', b"SELECT 1\0");
        for cut in 0..q.len() {
            assert_eq!(check.next_frame(&q[..cut]), Ok(None), "cut at {cut}");
        }
        assert_eq!(check.next_frame(&q), Ok(Some(q.len())));
    }

    #[tokio::test]
    async fn the_stream_hands_on_frames_before_a_fault_then_the_fault() {
        use tokio::io::AsyncReadExt;
        let mut bytes = startup();
        bytes.extend(frame(b'Q', b"SELECT 1\0"));
        let good = bytes.len();
        bytes.extend([b'P', 0, 0, 0, 5, 0]);
        let (mut client, server) = tokio::io::duplex(64);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            client.write_all(&bytes).await.unwrap();
            client
        });
        let mut checked = Checked::new(server, BytesMut::new());
        let mut got = vec![0u8; good];
        checked.read_exact(&mut got).await.unwrap();
        let e = checked.read(&mut [0u8; 16]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("Parse"), "{e}");
        drop(writer.await);
    }
}
