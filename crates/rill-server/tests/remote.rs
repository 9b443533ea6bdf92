//! The remote client against a stand-in OpenAI-compatible server on loopback, sending its
//! stream in deliberately awkward network chunks.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use futures_util::StreamExt;
use rill_engine::{Event, Message};
use rill_server::remote::{RemoteClient, RemoteRequest};

/// A server whose one answer arrives in `chunks`, 50 ms apart (so each is its own read).
async fn stand_in(chunks: Vec<Vec<u8>>) -> String {
    let app = Router::new().route(
        "/v1/chat/completions",
        post(move || {
            let chunks = chunks.clone();
            async move {
                let body = futures_util::stream::iter(chunks).then(|c| async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Ok::<_, Infallible>(Bytes::from(c))
                });
                Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(Body::from_stream(body))
                    .unwrap()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// Issue 13: a character split across network chunks (an "é", an emoji) comes out whole, not
/// as U+FFFD: bytes are split into lines before they are decoded.
#[tokio::test]
async fn characters_split_across_network_chunks_come_out_whole() {
    let mut first = br#"data: {"choices":[{"delta":{"content":"caf"#.to_vec();
    first.push(0xC3); // the first byte of "é"
    let second = vec![0xA9, b' ', 0xF0, 0x9F]; // the rest of "é", a space, half of "🦀"
    let mut third = vec![0xA6, 0x80];
    third.extend_from_slice(
        b"\"}}]}\n\ndata: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
    );
    let base = stand_in(vec![first, second, third]).await;
    let client = RemoteClient::new(&base, "m", None);
    let request = RemoteRequest {
        messages: vec![Message::user("hi")],
        ..Default::default()
    };
    let mut text = String::new();
    let mut done = false;
    client
        .generate(&request, |e| match e {
            Event::Token { text: t, .. } => text.push_str(&t),
            Event::Done { .. } => done = true,
            _ => {}
        })
        .await
        .unwrap();
    assert!(done);
    assert_eq!(text, "café 🦀");
}

/// Issue 40: a remote server that streams a line without end is broken off once the line
/// passes 4 MB, with an error saying so, instead of being held until memory runs out.
#[tokio::test]
async fn a_line_without_end_is_broken_off_not_held() {
    let mut chunks = vec![br#"data: {"choices":[{"delta":{"content":""#.to_vec()];
    // 5 MB of one line, in 1 MB chunks.
    chunks.extend((0..5).map(|_| vec![b'x'; 1 << 20]));
    let base = stand_in(chunks).await;
    let client = RemoteClient::new(&base, "m", None);
    let request = RemoteRequest {
        messages: vec![Message::user("hi")],
        ..Default::default()
    };
    let err = client.generate(&request, |_| {}).await.unwrap_err();
    assert!(err.to_string().contains("ran past 4 MB"), "{err}");
}
