//! Connections are bounded in number and must start talking: a client that
//! completes the TLS handshake and never sends a byte held its connection (and a descriptor)
//! for good — hyper decides between HTTP/1 and HTTP/2 by reading the first bytes, and no
//! timeout covers that read — and a thousand of them exhausted a server with 1,024 descriptors.
//!
//! [`Guard`] wraps the TLS acceptor: a connection beyond [`MAX_CONNECTIONS`] is closed at once,
//! and one that sends nothing within the idle timeout after its handshake is closed then.
//! (Hyper's own timeouts take over once bytes flow: header reads on HTTP/1, keep-alive pings on
//! HTTP/2.)

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Connections open at once. The API server multiplexes its webhook calls over a few HTTP/2
/// connections; this leaves room for many clients and for Verno's own descriptors.
pub const MAX_CONNECTIONS: usize = 512;

/// An acceptor around `inner` that holds connections to [`MAX_CONNECTIONS`] and to sending
/// their first byte within `first_byte`.
#[derive(Clone)]
pub struct Guard<A> {
    inner: A,
    permits: Arc<Semaphore>,
    first_byte: Duration,
}

impl<A> Guard<A> {
    pub fn new(inner: A, first_byte: Duration) -> Guard<A> {
        Guard::limited(inner, first_byte, MAX_CONNECTIONS)
    }

    fn limited(inner: A, first_byte: Duration, max: usize) -> Guard<A> {
        Guard { inner, permits: Arc::new(Semaphore::new(max)), first_byte }
    }
}

impl<A, I, S> axum_server::accept::Accept<I, S> for Guard<A>
where
    A: axum_server::accept::Accept<I, S> + Clone + Send + 'static,
    A::Future: Send,
    I: Send + 'static,
    S: Send + 'static,
{
    type Stream = Guarded<A::Stream>;
    type Service = A::Service;
    type Future = Pin<Box<dyn Future<Output = io::Result<(Self::Stream, Self::Service)>> + Send>>;

    fn accept(&self, stream: I, service: S) -> Self::Future {
        let permit = self.permits.clone().try_acquire_owned();
        let (inner, first_byte) = (self.inner.clone(), self.first_byte);
        Box::pin(async move {
            // Dropping the stream closes the connection.
            let permit = permit.map_err(|_| io::Error::other("too many connections"))?;
            let (stream, service) = inner.accept(stream, service).await?;
            let first = Some(Box::pin(tokio::time::sleep(first_byte)));
            Ok((Guarded { inner: stream, first, _permit: permit }, service))
        })
    }
}

/// A connection that holds one of the [`Guard`]'s permits while open, and fails its reads if
/// nothing arrives before its first-byte deadline.
pub struct Guarded<S> {
    inner: S,
    first: Option<Pin<Box<tokio::time::Sleep>>>,
    _permit: OwnedSemaphorePermit,
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    this.first = None;
                }
                Poll::Ready(r)
            }
            Poll::Pending => {
                let expired = this.first.as_mut().is_some_and(|deadline| deadline.as_mut().poll(cx).is_ready());
                if expired {
                    Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "no request after the handshake")))
                } else {
                    Poll::Pending
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use axum_server::accept::{Accept, DefaultAcceptor};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    #[tokio::test]
    async fn connections_past_the_limit_are_closed_and_a_closed_one_frees_its_place() {
        let guard = Guard::limited(DefaultAcceptor, Duration::from_secs(60), 2);
        let conn = || tokio::io::duplex(64).0;
        let a = guard.accept(conn(), ()).await.unwrap();
        let _b = guard.accept(conn(), ()).await.unwrap();
        assert!(guard.accept(conn(), ()).await.is_err());
        drop(a);
        assert!(guard.accept(conn(), ()).await.is_ok());
    }

    #[tokio::test]
    async fn a_connection_must_send_its_first_byte_in_time_and_then_may_pause() {
        let guard = Guard::limited(DefaultAcceptor, Duration::from_millis(200), 8);
        let (server, _client) = tokio::io::duplex(64);
        let (mut silent, ()) = guard.accept(server, ()).await.unwrap();
        let mut buf = [0u8; 8];
        let e = silent.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        // One that talks is not timed out by the guard afterwards.
        let (server, mut client) = tokio::io::duplex(64);
        let (mut talking, ()) = guard.accept(server, ()).await.unwrap();
        client.write_all(b"GET").await.unwrap();
        assert_eq!(talking.read(&mut buf).await.unwrap(), 3);
        let pause = tokio::time::timeout(Duration::from_millis(600), talking.read(&mut buf)).await;
        assert!(pause.is_err(), "the guard closed a connection that had talked");
    }
}
