//! The connections: accepted from the listener and each served by
//! hyper's HTTP/1.1 on a task of its own, under bounds a client cannot
//! stretch:
//!
//! - a request's headers must arrive within `header` of the connection's
//!   start or of its last reply's end (slow and idle connections close);
//! - its body within `body` (read by the handlers, [`super::body`]);
//! - a reply the client stops reading closes the connection once a write
//!   has waited `idle`;
//! - at shutdown, requests in flight get `shutdown` to end, then every
//!   connection is closed, whatever it is doing.

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// How long each part of a connection's life may take.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// Until a request's headers are in, from the connection's start or
    /// the end of its last reply (`--header-timeout`).
    pub header: Duration,
    /// Reading a request's body (`--body-timeout`).
    pub body: Duration,
    /// A write to a client that does not read (`--idle-timeout`).
    pub idle: Duration,
    /// From SIGINT / SIGTERM until every connection is closed
    /// (`--shutdown-timeout`).
    pub shutdown: Duration,
}

impl Default for Timeouts {
    fn default() -> Timeouts {
        Timeouts {
            header: Duration::from_secs(10),
            body: Duration::from_secs(30),
            idle: Duration::from_secs(60),
            shutdown: Duration::from_secs(10),
        }
    }
}

/// Accept and serve connections until `stop` turns true; then give the
/// open ones `timeouts.shutdown` to finish and close the rest.
pub async fn serve(listener: TcpListener, app: Router, timeouts: Timeouts, mut stop: watch::Receiver<bool>) {
    let mut conns = JoinSet::new();
    let each = stop.clone();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => {
                    conns.spawn(connection(tcp, app.clone(), timeouts, each.clone()));
                }
                // Out of file descriptors and the like: try again shortly.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            _ = stopped(&mut stop) => break,
        }
    }
    drop(listener);
    let drain = async { while conns.join_next().await.is_some() {} };
    if tokio::time::timeout(timeouts.shutdown, drain).await.is_err() {
        conns.abort_all();
    }
}

/// Ends when `stop` turns true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

async fn connection(tcp: TcpStream, app: Router, t: Timeouts, mut stop: watch::Receiver<bool>) {
    let _ = tcp.set_nodelay(true);
    let stall = Arc::new(Stall::default());
    let io = TokioIo::new(Watched {
        tcp,
        stall: stall.clone(),
    });
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(t.header);
    let conn = builder.serve_connection(io, TowerToHyperService::new(app));
    tokio::pin!(conn);
    let mut stopping = false;
    loop {
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = stopped(&mut stop), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = stall.exceeds(t.idle) => return,
        }
    }
}

/// Since when a write to the connection has been waiting (the client
/// reads nothing).
#[derive(Debug)]
struct Stall {
    epoch: Instant,
    /// Milliseconds after `epoch`, plus one; 0: no write waits.
    since: AtomicU64,
}

impl Default for Stall {
    fn default() -> Stall {
        Stall {
            epoch: Instant::now(),
            since: AtomicU64::new(0),
        }
    }
}

impl Stall {
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    fn note(&self, waiting: bool) {
        if waiting {
            let _ = self
                .since
                .compare_exchange(0, self.now(), Ordering::Relaxed, Ordering::Relaxed);
        } else {
            self.since.store(0, Ordering::Relaxed);
        }
    }

    /// Ends once a write has waited `limit`.
    async fn exceeds(&self, limit: Duration) {
        let limit_ms = limit.as_millis() as u64;
        let step = (limit / 4).max(Duration::from_millis(20));
        loop {
            let since = self.since.load(Ordering::Relaxed);
            if since != 0 && self.now().saturating_sub(since) >= limit_ms {
                return;
            }
            tokio::time::sleep(step).await;
        }
    }
}

/// A TCP stream that tells its [`Stall`] when writes wait.
struct Watched {
    tcp: TcpStream,
    stall: Arc<Stall>,
}

impl Watched {
    fn noted<T>(&self, p: Poll<T>) -> Poll<T> {
        self.stall.note(p.is_pending());
        p
    }
}

impl AsyncRead for Watched {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for Watched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let p = Pin::new(&mut self.tcp).poll_write(cx, buf);
        self.noted(p)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let p = Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs);
        self.noted(p)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn a_write_that_waits_past_the_idle_limit_ends_the_connection() {
        let limit = Duration::from_millis(80);
        let stall = Stall::default();
        // Writes that go through never stall.
        stall.note(false);
        let quiet = tokio::time::timeout(limit * 4, stall.exceeds(limit)).await;
        assert!(quiet.is_err());
        // A write that waits: over the limit within a step or so.
        stall.note(true);
        let t = Instant::now();
        tokio::time::timeout(limit * 4, stall.exceeds(limit))
            .await
            .expect("the stall was not seen");
        assert!(t.elapsed() >= limit);
        // Waiting again does not move its start.
        let since = stall.since.load(Ordering::Relaxed);
        stall.note(true);
        assert_eq!(stall.since.load(Ordering::Relaxed), since);
    }
}
