//! Tool calls through the API with `--save` (issue 16), on the real SmolLM2 model: a
//! conversation with a past call and its result is kept as calls and results (role `tool`),
//! not as text, and the model's own forced call, whole or streamed, is saved as a call with
//! the arguments the client received.

mod common;

use common::{client, Server};
use serde_json::{json, Value};

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "The forecast for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                       "required": ["city", "days"], "additionalProperties": false}}}])
}

/// A question, a past call with its result, and a second question the model must answer with
/// a call.
fn body(stream: bool) -> Value {
    json!({
        "messages": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call0abcd", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 2}"}}]},
            {"role": "tool", "tool_call_id": "call0abcd", "content": "{\"forecast\": [\"sunny\", \"rain\"]}"},
            {"role": "user", "content": "And in Rome?"}
        ],
        "tools": tools(),
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "temperature": 0,
        "max_tokens": 60,
        "stream": stream,
    })
}

#[test]
fn saved_conversations_keep_tool_calls_and_results_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("api.db");
    let db = db.to_str().unwrap();
    let server = Server::start(&["--db", db, "--save"]);
    let http = client();
    let whole: Value = http
        .post(server.url("/v1/chat/completions"))
        .json(&body(false))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let call = &whole["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather", "{whole}");
    let streamed = http
        .post(server.url("/v1/chat/completions"))
        .json(&body(true))
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(streamed.contains("\"tool_calls\""), "{streamed}");
    drop(server); // the saves are written before the reply ends; the server goes

    for id in [1, 2] {
        let saved = common::export_json(db, id);
        let m = saved["messages"].as_array().unwrap();
        let roles: Vec<&str> = m.iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(
            roles,
            ["user", "assistant", "tool", "user", "assistant"],
            "{saved}"
        );
        // The client's past call and result, as it sent them.
        assert_eq!(m[1]["content"], "");
        assert_eq!(
            m[1]["tool_calls"],
            json!([{"id": "call0abcd", "name": "get_weather", "arguments": {"city": "Paris", "days": 2}}])
        );
        assert_eq!(m[2]["tool_call_id"], "call0abcd");
        assert_eq!(m[2]["content"], "{\"forecast\": [\"sunny\", \"rain\"]}");
        // The model's call: a call, not text.
        let answer = &m[4];
        assert_eq!(answer["status"], "done");
        assert!(
            !answer["content"].as_str().unwrap().contains("<tool_call>"),
            "{answer}"
        );
        let saved_call = &answer["tool_calls"][0];
        assert_eq!(saved_call["name"], "get_weather", "{answer}");
        assert!(saved_call["arguments"]["city"].is_string(), "{answer}");
        if id == 1 {
            // The same call the client got, id and arguments.
            assert_eq!(saved_call["id"], call["id"]);
            let sent: Value =
                serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
            assert_eq!(saved_call["arguments"], sent);
        }
    }
}
