//! Who may talk to the API.
//!
//! With an API key, a request must carry it (`Authorization: Bearer <key>`, compared in
//! constant time). Without one (the default, on 127.0.0.1), any program on this machine may,
//! but no web page: a page the user opens can reach 127.0.0.1 through a domain that resolves
//! there (DNS rebinding), so only requests naming this machine in `Host` (a loopback address,
//! `localhost`) and coming from no foreign page (`Origin`, when a browser sends one) are served
//! (issue 13). That check runs whether a key is set or not: a request naming another host or
//! from a foreign page passes only by carrying the key (issue 40: a blank key used to switch it
//! off and let everything in).

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::error::ApiError;
use crate::AppState;

/// Whether `host` (a `Host` header: a name or address, maybe with a port) names this machine.
pub fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        // [::1]:8080
        Some(v6) => match v6.split_once(']') {
            Some((addr, rest)) if rest.is_empty() || rest.starts_with(':') => addr,
            _ => return false,
        },
        None => match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            Some(_) => return false,
            None => host,
        },
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost"
        || name.ends_with(".localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Whether an `Origin` header is a page of this machine (`http://localhost:5173`).
fn is_loopback_origin(origin: &str) -> bool {
    match origin.split_once("://") {
        Some((_, rest)) => is_loopback_host(rest.split('/').next().unwrap_or("")),
        None => false, // "null": a sandboxed or file page
    }
}

/// Why a request that does not carry the key is refused, if it is.
fn foreign(headers: &HeaderMap) -> Option<String> {
    let text = |h| headers.get(h).map(|v| v.to_str().unwrap_or("(not text)"));
    if let Some(host) = text(header::HOST).filter(|h| !is_loopback_host(h)) {
        return Some(format!(
            "`Host: {host}` does not name this machine; without an API key only local requests \
             are served (start the server with --api-key, and send it, to serve other names)"
        ));
    }
    if let Some(origin) = text(header::ORIGIN).filter(|o| !is_loopback_origin(o)) {
        return Some(format!(
            "requests from web pages (`Origin: {origin}`) need an API key"
        ));
    }
    None
}

/// Whether the request carries the server's key (always true when there is none).
pub(crate) fn has_key(s: &AppState, headers: &HeaderMap) -> bool {
    let Some(key) = &s.api_key else {
        return true;
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    bool::from(given.as_bytes().ct_eq(key.as_bytes()))
}

/// Every route: refuse requests a web page could have sent, unless they carry the key.
pub(crate) async fn local_only(
    State(s): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(why) = foreign(request.headers()) {
        if s.api_key.is_none() || !has_key(&s, request.headers()) {
            return ApiError::forbidden(why).into_response();
        }
    }
    next.run(request).await
}

/// The `/v1` routes: the key, when the server has one.
pub(crate) async fn require_key(
    State(s): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    if !has_key(&s, request.headers()) {
        return ApiError::unauthorized().into_response();
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_are_names_of_this_machine_only() {
        for ok in [
            "127.0.0.1",
            "127.0.0.1:8080",
            "127.1.2.3:1",
            "localhost",
            "LOCALHOST:8080",
            "app.localhost:3000",
            "[::1]:8080",
            "[::1]",
            "localhost.",
        ] {
            assert!(is_loopback_host(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8080",
            "127.0.0.1.evil.example",
            "localhost.evil.example",
            "10.0.0.5:8080",
            "[::1]x",
            "[2001:db8::1]:80",
            "0.0.0.0:8080",
            "127.0.0.1:80a",
            "",
        ] {
            assert!(!is_loopback_host(bad), "{bad}");
        }
        assert!(is_loopback_origin("http://localhost:5173"));
        assert!(is_loopback_origin("http://127.0.0.1:8080/"));
        assert!(!is_loopback_origin("https://evil.example"));
        assert!(!is_loopback_origin("null"));
    }
}
