//! Seeing a backend's GOAWAY when it arrives, so the connection takes no new streams.
//!
//! A server closing a connection gracefully sends GOAWAY naming the last stream it will process,
//! finishes those, and closes. A stream opened after the GOAWAY is ignored by the server (RFC
//! 9113 §6.8), and h2 keeps opening streams on such a connection: the close then reports them as
//! a broken pipe, which cannot be told apart from a request the backend did receive, so a create
//! sent in that window failed (1 in about 900 under a GOAWAY every 20 requests). Go's transport
//! stops using a connection once it reads GOAWAY; hyper does not say when one arrives. So the
//! pool's connections read the server's frame headers as they pass ([`GoAwayWatch`]), which
//! costs a few comparisons per read, and mark the connection when a GOAWAY frame goes by.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const FRAME_HEADER: usize = 9;
const GOAWAY: u8 = 0x7;

/// Set once the server sent GOAWAY on a connection.
#[derive(Default)]
pub struct GoAwaySeen(AtomicBool);

// === impl GoAwaySeen ===

impl GoAwaySeen {
    pub fn seen(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// The read side of an HTTP/2 client connection, its frames followed (see the module docs).
pub struct GoAwayWatch<T> {
    inner: T,
    seen: Arc<GoAwaySeen>,
    frames: FrameReader,
}

// === impl GoAwayWatch ===

impl<T> GoAwayWatch<T> {
    pub fn new(inner: T) -> (Self, Arc<GoAwaySeen>) {
        let seen = Arc::new(GoAwaySeen::default());
        let watch = Self {
            inner,
            seen: seen.clone(),
            frames: FrameReader::default(),
        };
        (watch, seen)
    }
}

/// Follows frame boundaries over the bytes a server sends (it starts with a frame: a server's
/// connection preface is its SETTINGS frame).
#[derive(Default)]
struct FrameReader {
    header: [u8; FRAME_HEADER],
    /// Bytes of the current frame header read so far.
    have: usize,
    /// Payload bytes of the current frame still to pass.
    skip: usize,
}

// === impl FrameReader ===

impl FrameReader {
    /// Reads `bytes`; `true` when a GOAWAY frame header was among them.
    fn read(&mut self, mut bytes: &[u8]) -> bool {
        let mut goaway = false;
        while !bytes.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (FRAME_HEADER - self.have).min(bytes.len());
            self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have == FRAME_HEADER {
                let h = &self.header;
                self.skip = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                goaway |= h[3] == GOAWAY;
                self.have = 0;
            }
        }
        goaway
    }
}

// === impl GoAwayWatch ===

impl<T: AsyncRead + Unpin> AsyncRead for GoAwayWatch<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let read = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = read {
            if this.frames.read(&buf.filled()[before..]) {
                this.seen.0.store(true, Ordering::Release);
            }
        }
        read
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for GoAwayWatch<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
            kind,
            0,
            0,
            0,
            0,
            0,
        ];
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn a_goaway_is_seen_across_any_read_boundaries() {
        let mut bytes = frame(0x4, &[0; 12]); // SETTINGS
        bytes.extend(frame(0x0, &[7; 300])); // DATA that happens to hold 0x07 bytes
        bytes.extend(frame(0x6, &[0; 8])); // PING
        let before_goaway = bytes.len();
        bytes.extend(frame(GOAWAY, &[0, 0, 0, 5, 0, 0, 0, 0]));
        for chunk in [1, 2, 5, 9, 10, 64, 1000] {
            let mut reader = FrameReader::default();
            let mut seen_at = None;
            for (i, piece) in bytes.chunks(chunk).enumerate() {
                if reader.read(piece) && seen_at.is_none() {
                    seen_at = Some((i + 1) * chunk);
                }
            }
            let at = seen_at.expect("GOAWAY seen");
            assert!(at > before_goaway, "seen too early with reads of {chunk}");
        }
        let mut reader = FrameReader::default();
        assert!(!reader.read(&bytes[..before_goaway]), "no GOAWAY before it");
    }
}
