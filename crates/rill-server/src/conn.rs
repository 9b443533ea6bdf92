//! Connections, bounded: the server cannot be stalled by clients that connect and say nothing
//! (issue 40).
//!
//! axum's own `serve` accepts every connection and waits for a request's headers and body as
//! long as the client likes, so a few hundred idle sockets, or one request that sends its body
//! a byte a minute, held the server's resources without end. Here each connection is served by
//! hyper with a [`HEADER_TIMEOUT`] on the request head, a request's body must arrive within
//! [`BODY_TIMEOUT`] ([`body_in_time`]), and at most [`MAX_CONNECTIONS`] are open at once (the
//! next waits in the kernel's backlog until one closes). A streamed answer is not timed: it
//! lasts as long as the model writes.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;

use crate::error::ApiError;

/// How long a client may take to send a request's head (line and headers).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take to send a request's body.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Most connections open at once.
pub const MAX_CONNECTIONS: usize = 256;

/// Serves `app` on `listener` until `shutdown` completes, then lets open connections finish
/// what they are answering.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let open = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let (closing, closed) = tokio::sync::watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = open.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break, // never closed
            },
            _ = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, or a connection reset before it was taken:
                    // wait a moment rather than spin.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let service = TowerToHyperService::new(app.clone());
        let mut closed = closed.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                done = conn.as_mut() => {
                    if let Err(e) = done {
                        tracing::debug!(error = %e, "connection ended");
                    }
                }
                _ = closed.changed() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
    let _ = closing.send(true);
    // Every connection gives its permit back when it ends.
    let _ = open.acquire_many(MAX_CONNECTIONS as u32).await;
    Ok(())
}

/// Reads a request's whole body within [`BODY_TIMEOUT`] (and at most `limit` bytes) before
/// the handler sees it: a client that trickles its body is answered 408, not waited for.
pub(crate) async fn body_in_time(
    State(limit): State<usize>,
    request: Request,
    next: Next,
) -> Response {
    let (parts, body) = request.into_parts();
    match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(bytes)) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        // Past the limit (or broken off, when the client is gone anyway).
        Ok(Err(_)) => ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            ..ApiError::bad_request("request body too large")
        }
        .into_response(),
        Err(_) => ApiError {
            status: StatusCode::REQUEST_TIMEOUT,
            ..ApiError::bad_request(format!(
                "the request's body did not arrive within {} s",
                BODY_TIMEOUT.as_secs()
            ))
        }
        .into_response(),
    }
}
