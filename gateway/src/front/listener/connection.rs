//! What one client connection is doing, as far as its deadlines and buffers go, and the I/O
//! wrapper that enforces them.
//!
//! Go's `net/http` server, which kube-apiserver uses, gives a connection three clocks; so do we:
//! - a new connection must deliver its first request within the header read timeout;
//! - between requests, a connection may stay idle for [`IDLE_TIMEOUT`] (kube-apiserver's 90 s,
//!   the keep-alive timing clients pool connections on), after which HTTP/1.1 is closed and
//!   HTTP/2 is sent a GOAWAY;
//! - once the first bytes of the next HTTP/1.1 request head arrive, the head must be complete
//!   within the header read timeout.
//!
//! While an exchange is open, none of these apply: the request timeout bounds ordinary exchanges
//! (see `front::stack::timeout`), and long-running ones may run for hours.
//!
//! HTTP/1.1 responses are also paced ([`paced`]): hyper buffers a response body up to its
//! `max_buf_size`, which must be as large as the largest request head (1 MiB), so a client that
//! stops reading would pin that much; the body is instead handed over only while less than
//! [`WRITE_WINDOW`] of it waits to be written to the socket.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http_body::Frame;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::body::{Body, BoxError};
use crate::front::stack::timeout::ExchangeDeadline;

/// How long a connection may idle between requests: kube-apiserver's `IdleTimeout` for HTTP/1.1
/// and HTTP/2, matching Go's `http.DefaultTransport` keep-alive timeout that clients use.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// How much of an HTTP/1.1 response body may wait for the client at a time.
pub const WRITE_WINDOW: usize = 64 * 1024;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Protocol {
    Http1,
    Http2,
}

// === impl ConnState ===

/// Shared by a connection's task, its I/O wrapper and its exchanges.
pub struct ConnState {
    protocol: Protocol,
    header_read_timeout: Duration,
    /// HTTP/1.1: the deadline of the exchange in progress, one at a time. (Each HTTP/2 stream
    /// has its own, in its own task.)
    exchange: Option<ExchangeDeadline>,
    phase: Mutex<Phase>,
}

struct Phase {
    /// Exchanges whose response is not finished.
    open: usize,
    /// When `open` last fell to 0 (or the connection started).
    idle_since: Instant,
    /// At least one request arrived.
    served: bool,
    /// HTTP/1.1: the first bytes of the next request head arrived at this instant.
    head_started: Option<Instant>,
    /// The connection was switched to another protocol (101): its bytes are a tunnel's.
    upgraded: bool,
    /// Bytes of the current HTTP/1.1 response body handed to hyper and not yet written out.
    unwritten: usize,
    /// The paced body waiting for `unwritten` to shrink.
    writer: Option<Waker>,
}

impl ConnState {
    pub fn new(protocol: Protocol, header_read_timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            protocol,
            header_read_timeout,
            exchange: (protocol == Protocol::Http1).then(ExchangeDeadline::default),
            phase: Mutex::new(Phase {
                open: 0,
                idle_since: Instant::now(),
                served: false,
                head_started: None,
                upgraded: false,
                unwritten: 0,
                writer: None,
            }),
        })
    }

    fn phase(&self) -> MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A request arrived; the returned guard ends the exchange when dropped (with the response
    /// body, or with the request if it never got one).
    pub fn begin(self: &Arc<Self>) -> ExchangeGuard {
        {
            let mut phase = self.phase();
            phase.open += 1;
            phase.served = true;
            phase.head_started = None;
            phase.unwritten = 0;
        }
        if let Some(exchange) = &self.exchange {
            exchange.disarm();
        }
        ExchangeGuard(self.clone())
    }

    /// The HTTP/1.1 connection's exchange deadline.
    pub fn exchange(&self) -> Option<&ExchangeDeadline> {
        self.exchange.as_ref()
    }

    /// The connection now carries a tunnel (after a 101): no deadlines of ours apply.
    pub fn upgraded(&self) {
        self.phase().upgraded = true;
    }

    /// The read deadline in force, if any: the first request's, or an HTTP/1.1 head's.
    fn read_deadline(&self) -> Option<Instant> {
        let phase = self.phase();
        if phase.open > 0 || phase.upgraded {
            return None;
        }
        if !phase.served {
            return Some(phase.idle_since + self.header_read_timeout);
        }
        phase.head_started.map(|t| t + self.header_read_timeout)
    }

    /// Bytes arrived from the client.
    fn read_some(&self) {
        if self.protocol == Protocol::Http1 {
            let mut phase = self.phase();
            if phase.open == 0 && phase.served && phase.head_started.is_none() {
                phase.head_started = Some(Instant::now());
            }
        }
    }

    /// Bytes of a response left for the client.
    fn wrote(&self, n: usize) {
        let waker = {
            let mut phase = self.phase();
            phase.unwritten = phase.unwritten.saturating_sub(n);
            (phase.unwritten < WRITE_WINDOW)
                .then(|| phase.writer.take())
                .flatten()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Resolves once the connection has been idle (no open exchange, no request head under way)
    /// for [`IDLE_TIMEOUT`].
    ///
    /// Checked lazily: exchanges do not wake this task as they open and close (two wake-ups per
    /// request, often on another worker thread, were a measurable part of a small request's
    /// cost). It sleeps until the idle deadline it last saw, or for [`IDLE_TIMEOUT`] while
    /// exchanges are open, and looks again; a deadline that moved meanwhile is only later.
    pub async fn idle_expired(&self) {
        loop {
            let deadline = {
                let phase = self.phase();
                let idle = phase.open == 0
                    && phase.served
                    && phase.head_started.is_none()
                    && !phase.upgraded;
                idle.then_some(phase.idle_since + IDLE_TIMEOUT)
            };
            match deadline {
                Some(at) if at <= Instant::now() => return,
                Some(at) => tokio::time::sleep_until(at).await,
                None => tokio::time::sleep(IDLE_TIMEOUT).await,
            }
        }
    }
}

/// Ends its exchange when dropped.
pub struct ExchangeGuard(Arc<ConnState>);

impl ExchangeGuard {
    /// The connection the exchange is on.
    pub fn state(&self) -> &Arc<ConnState> {
        &self.0
    }
}

impl Drop for ExchangeGuard {
    fn drop(&mut self) {
        {
            let mut phase = self.0.phase();
            phase.open -= 1;
            if phase.open == 0 {
                phase.idle_since = Instant::now();
            }
        }
        // Its response is written (or dropped): the deadline no longer applies.
        if let Some(exchange) = &self.0.exchange {
            exchange.disarm();
        }
    }
}

// === impl Deadlines ===

/// The connection's byte stream, failing reads past the read deadline in force (the failed
/// read ends the connection) and counting bytes written for [`paced`] bodies.
pub struct Deadlines<T> {
    inner: T,
    state: Arc<ConnState>,
    timer: Pin<Box<Sleep>>,
    timer_at: Option<Instant>,
}

impl<T> Deadlines<T> {
    pub fn new(inner: T, state: Arc<ConnState>) -> Self {
        Deadlines {
            inner,
            state,
            timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
            timer_at: None,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Deadlines<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        // Bytes already here are handed over first: a request that arrives right at the
        // deadline is served rather than cut off.
        let before = buf.filled().len();
        if let Poll::Ready(read) = Pin::new(&mut this.inner).poll_read(cx, buf) {
            if buf.filled().len() > before {
                this.state.read_some();
            }
            return Poll::Ready(read);
        }
        let Some(deadline) = this.state.read_deadline() else {
            return Poll::Pending;
        };
        if this.timer_at != Some(deadline) {
            this.timer.as_mut().reset(deadline);
            this.timer_at = Some(deadline);
        }
        if this.timer.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no complete request head within the header read timeout",
            )));
        }
        Poll::Pending
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Deadlines<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = written {
            self.state.wrote(n);
        }
        written
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = written {
            self.state.wrote(n);
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

// === impl Lingering ===

/// How long a connection the gateway closes keeps reading (and discarding) what the client still
/// sends. Go's server waits 500 ms for the same reason (`rstAvoidanceDelay`); reading instead of
/// only waiting also lets a client that is still uploading finish and read the answer.
pub const LINGER: Duration = Duration::from_millis(500);

/// The client's TCP connection, closed the way Go's server closes one.
///
/// When the gateway ends a connection while the client may still be sending (an HTTP/1.1
/// request body it stopped reading: a 413, or any answer that did not need the whole body),
/// closing the socket with bytes unread makes the kernel answer them with a reset, and a client
/// still uploading fails its upload (curl: "Send failure: Connection reset by peer") instead of
/// reading the answer. So once the write side has been shut down (after the response and TLS's
/// close_notify), what still arrives is read and thrown away until the client closes its side
/// or [`LINGER`] has passed; only then is the socket closed, and the connection's place under
/// the connection cap given back.
pub struct Lingering<P: Send + 'static> {
    tcp: Option<tokio::net::TcpStream>,
    /// Set once the write side was shut down: the gateway is the one closing.
    closing: bool,
    /// Held until the socket is closed (the connection cap's permit).
    held: Option<P>,
}

impl<P: Send + 'static> Lingering<P> {
    pub fn new(tcp: tokio::net::TcpStream, held: P) -> Self {
        Self {
            tcp: Some(tcp),
            closing: false,
            held: Some(held),
        }
    }

    fn tcp(&mut self) -> &mut tokio::net::TcpStream {
        self.tcp.as_mut().expect("taken only on drop")
    }
}

// Nothing in it is ever pinned: the socket is Unpin and `held` is only moved out on drop.
impl<P: Send + 'static> Unpin for Lingering<P> {}

impl<P: Send + 'static> Drop for Lingering<P> {
    fn drop(&mut self) {
        let (Some(tcp), true) = (self.tcp.take(), self.closing) else {
            return;
        };
        let held = self.held.take();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let mut tcp = tcp;
            let mut scratch = [0u8; 16 * 1024];
            let drain = async {
                use tokio::io::AsyncReadExt;
                while let Ok(n) = tcp.read(&mut scratch).await {
                    if n == 0 {
                        break;
                    }
                }
            };
            let _ = tokio::time::timeout(LINGER, drain).await;
            drop(held);
        });
    }
}

impl<P: Send + 'static> AsyncRead for Lingering<P> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(self.tcp()).poll_read(cx, buf)
    }
}

impl<P: Send + 'static> AsyncWrite for Lingering<P> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(self.tcp()).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(self.tcp()).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.as_ref().is_some_and(|t| t.is_write_vectored())
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.tcp()).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let shut = Pin::new(self.tcp()).poll_shutdown(cx);
        if shut.is_ready() {
            self.closing = true;
        }
        shut
    }
}

// === impl Paced ===

/// The response body as hyper gets it: `body`, holding `exchange` until it is finished or
/// dropped. On HTTP/1.1 it is also handed over at most [`WRITE_WINDOW`] ahead of what reached
/// the socket, in pieces no larger than the window (splitting `Bytes` copies nothing); HTTP/2's
/// own flow control bounds what waits there, so its frames pass as they come.
///
/// Not boxed: hyper serves this type as it is, so a response costs no allocation here and no
/// dynamic call per frame beyond the inner body's.
pub fn paced(body: Body, state: Arc<ConnState>, exchange: ExchangeGuard) -> Paced {
    Paced {
        inner: body,
        state,
        rest: Bytes::new(),
        _exchange: exchange,
    }
}

pub struct Paced {
    inner: Body,
    state: Arc<ConnState>,
    /// What is left of a chunk larger than the window.
    rest: Bytes,
    /// Dropped last, after the body: the exchange ends when its response does.
    _exchange: ExchangeGuard,
}

impl http_body::Body for Paced {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.state.protocol == Protocol::Http2 {
            return poll_nonempty(&mut this.inner, cx);
        }
        {
            let mut phase = this.state.phase();
            if phase.unwritten >= WRITE_WINDOW {
                phase.writer = Some(cx.waker().clone());
                return Poll::Pending;
            }
        }
        if this.rest.is_empty() {
            match poll_nonempty(&mut this.inner, cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => this.rest = data,
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                other => return other,
            }
        }
        let piece = this.rest.split_to(this.rest.len().min(WRITE_WINDOW));
        this.state.phase().unwritten += piece.remaining();
        Poll::Ready(Some(Ok(Frame::data(piece))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        // Kept exact when the inner one is, so a Content-Length stays a Content-Length.
        let inner = self.inner.size_hint();
        let rest = self.rest.len() as u64;
        if let Some(exact) = inner.exact() {
            return http_body::SizeHint::with_exact(exact + rest);
        }
        let mut hint = http_body::SizeHint::new();
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + rest);
        }
        hint.set_lower(inner.lower() + rest);
        hint
    }
}

/// The next frame of `body`, passing over empty DATA frames that do not end it: they carry
/// nothing, and on HTTP/2 a client counts them against a small allowance per connection (h2, in
/// hyper and kube-rs, sends GOAWAY ENHANCE_YOUR_CALM "too_many_data_frames" after 100). An empty
/// frame at the body's end passes: hyper sends it as the frame that closes the stream.
fn poll_nonempty(
    body: &mut Body,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
    loop {
        match http_body::Body::poll_frame(Pin::new(&mut *body), cx) {
            Poll::Ready(Some(Ok(frame)))
                if frame.data_ref().is_some_and(|d| d.is_empty())
                    && !http_body::Body::is_end_stream(body) => {}
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::task::Poll;

    use http_body::Body as _;

    use super::*;

    fn poll_frame(body: &mut Paced) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        Pin::new(body).poll_frame(&mut cx)
    }

    fn data_len(poll: Poll<Option<Result<Frame<Bytes>, BoxError>>>) -> Option<usize> {
        match poll {
            Poll::Ready(Some(Ok(frame))) => frame.into_data().ok().map(|d| d.len()),
            _ => None,
        }
    }

    /// A connection of `protocol` with one exchange open, answered by three windows' worth.
    fn three_windows(protocol: Protocol) -> (Arc<ConnState>, Paced) {
        let state = ConnState::new(protocol, Duration::from_secs(10));
        let exchange = state.begin();
        let body = crate::body::full(vec![0u8; 3 * WRITE_WINDOW]);
        (state.clone(), paced(body, state, exchange))
    }

    #[tokio::test]
    async fn a_paced_body_stays_one_window_ahead_of_the_socket() {
        let (state, mut body) = three_windows(Protocol::Http1);
        assert_eq!(body.size_hint().exact(), Some(3 * WRITE_WINDOW as u64));

        assert_eq!(data_len(poll_frame(&mut body)), Some(WRITE_WINDOW));
        assert!(
            poll_frame(&mut body).is_pending(),
            "handed over past the window"
        );
        state.wrote(WRITE_WINDOW / 2);
        assert_eq!(data_len(poll_frame(&mut body)), Some(WRITE_WINDOW));
        assert!(poll_frame(&mut body).is_pending());
        state.wrote(2 * WRITE_WINDOW);
        assert_eq!(data_len(poll_frame(&mut body)), Some(WRITE_WINDOW));
        state.wrote(WRITE_WINDOW);
        assert!(matches!(poll_frame(&mut body), Poll::Ready(None)));
        // The body held the exchange open until it was dropped.
        assert_eq!(state.phase().open, 1);
        drop(body);
        assert_eq!(state.phase().open, 0);
    }

    #[tokio::test]
    async fn an_http2_body_passes_unpaced_and_holds_its_exchange() {
        let (state, mut body) = three_windows(Protocol::Http2);
        // One frame as it came, nothing written to the socket counted: HTTP/2's own flow
        // control bounds what waits.
        assert_eq!(data_len(poll_frame(&mut body)), Some(3 * WRITE_WINDOW));
        assert!(matches!(poll_frame(&mut body), Poll::Ready(None)));
        // The exchange stays open (the connection is not idle) until the body is dropped.
        assert_eq!(state.phase().open, 1);
        drop(body);
        assert_eq!(state.phase().open, 0);
    }

    #[tokio::test]
    async fn empty_data_frames_that_do_not_end_the_body_are_never_handed_to_hyper() {
        for protocol in [Protocol::Http1, Protocol::Http2] {
            let state = ConnState::new(protocol, Duration::from_secs(10));
            let exchange = state.begin();
            let frames = ["", "a", "", "", "b", ""]
                .map(|d| Ok::<_, BoxError>(Frame::data(Bytes::from_static(d.as_bytes()))));
            let inner = crate::body::boxed(http_body_util::StreamBody::new(futures::stream::iter(
                frames,
            )));
            let mut body = paced(inner, state, exchange);
            assert_eq!(data_len(poll_frame(&mut body)), Some(1), "{protocol:?}");
            assert_eq!(data_len(poll_frame(&mut body)), Some(1), "{protocol:?}");
            assert!(
                matches!(poll_frame(&mut body), Poll::Ready(None)),
                "{protocol:?}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_http1_connection_idles_until_bytes_arrive_then_has_the_header_timeout() {
        let header_read_timeout = Duration::from_secs(10);
        let state = ConnState::new(Protocol::Http1, header_read_timeout);
        let started = Instant::now();
        assert_eq!(state.read_deadline(), Some(started + header_read_timeout));
        drop(state.begin());
        // Idle between requests: no read deadline, the idle timeout instead.
        assert_eq!(state.read_deadline(), None);
        let idle = tokio::time::timeout(IDLE_TIMEOUT * 2, state.idle_expired()).await;
        assert!(idle.is_ok());
        assert!(Instant::now() >= started + IDLE_TIMEOUT);
        // The next head's first bytes start the header read timeout.
        state.read_some();
        assert_eq!(
            state.read_deadline(),
            Some(Instant::now() + header_read_timeout)
        );
    }
}
