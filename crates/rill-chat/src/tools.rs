//! Tool calls as the store keeps them: an assistant message's `tool_calls` column, a JSON array
//! of `{"id", "name", "arguments"}` with the arguments as JSON (the window shows them indented),
//! read back into the engine's calls when the conversation is rendered again.

use rill_engine::ToolCall;

/// Tool calls as the store keeps them: `[{"id", "name", "arguments"}]`, the arguments as
/// JSON (or as the text the model wrote, when that is not JSON).
pub fn calls_json(calls: &[ToolCall]) -> serde_json::Value {
    calls
        .iter()
        .map(|c| {
            let arguments = serde_json::from_str(&c.arguments)
                .unwrap_or_else(|_| serde_json::Value::String(c.arguments.clone()));
            serde_json::json!({"id": c.id, "name": c.name, "arguments": arguments})
        })
        .collect()
}

/// The calls of [`calls_json`]'s form (entries that are not calls are left out).
pub fn calls_of(v: &serde_json::Value) -> Vec<ToolCall> {
    let text = |a: &serde_json::Value| match a {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| {
            Some(ToolCall {
                id: c["id"].as_str()?.to_owned(),
                name: c["name"].as_str()?.to_owned(),
                arguments: text(&c["arguments"]),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_round_trip_through_the_stored_form() {
        let calls = vec![
            ToolCall {
                id: "call0abcd".into(),
                name: "get_weather".into(),
                arguments: r#"{"city":"Paris"}"#.into(),
            },
            // A model's arguments that are not JSON stay the text it wrote.
            ToolCall {
                id: "call1efgh".into(),
                name: "echo".into(),
                arguments: "not json".into(),
            },
        ];
        let stored = calls_json(&calls);
        assert_eq!(stored[0]["arguments"]["city"], "Paris");
        assert_eq!(stored[1]["arguments"], "not json");
        assert_eq!(calls_of(&stored), calls);
        assert!(calls_of(&serde_json::json!([{"name": "no id"}])).is_empty());
    }
}
