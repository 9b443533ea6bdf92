//! The request log the app shows beside its API toggle: the last requests, newest last, with
//! their status and how long they took (a streamed answer: until its last byte was handed over).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use serde::Serialize;

/// How many requests the log keeps.
const KEEP: usize = 200;

#[derive(Clone, Debug, Serialize)]
pub struct LoggedRequest {
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    pub method: String,
    pub path: String,
    pub status: u16,
    /// Until the response head was ready (the first token, for a stream).
    pub ms: f64,
}

/// A shared ring of the last requests. Cloning shares it.
#[derive(Clone, Debug, Default)]
pub struct RequestLog(Arc<Mutex<VecDeque<LoggedRequest>>>);

impl RequestLog {
    pub fn entries(&self) -> Vec<LoggedRequest> {
        self.0
            .lock()
            .map(|l| l.iter().cloned().collect())
            .unwrap_or_default()
    }

    fn push(&self, entry: LoggedRequest) {
        // A poisoned lock only means a panic elsewhere mid-push; the ring is still sound.
        let mut l = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if l.len() == KEEP {
            l.pop_front();
        }
        l.push_back(entry);
    }
}

pub(crate) async fn record(
    State(log): State<RequestLog>,
    request: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let at_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let method = request.method().to_string();
    let path = request.uri().path().to_owned();
    let response = next.run(request).await;
    log.push(LoggedRequest {
        at_ms,
        method,
        path,
        status: response.status().as_u16(),
        ms: started.elapsed().as_secs_f64() * 1000.0,
    });
    response
}
