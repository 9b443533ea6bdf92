//! Tools on the way in: the conversation for a template that knows nothing of tools, and the
//! grammar that makes a model call a tool when the client insists (`tool_choice`).
//!
//! A template without tools (SmolLM2's plain ChatML) gets them as llama.cpp gives generic
//! templates, in the Hermes format: the system message lists the functions' signatures in
//! `<tools>` and asks for `<tool_call>` blocks; past calls are written back as those blocks
//! and tool results as user turns of `<tool_response>` blocks, so the model sees one format
//! throughout.

use serde_json::{json, Value};

use super::ToolFormat;
use crate::message::{Message, Role};

/// The conversation with the tools described in its system message (when there are any) and
/// calls and results written out in the Hermes format.
pub fn described(messages: &[Message], tools: &[Value]) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::with_capacity(messages.len() + 1);
    let system = messages.first().filter(|m| m.role == Role::System);
    if !tools.is_empty() {
        let mut listing = String::from(
            "# Tools\n\nYou can call functions to help with the user's request. Their signatures, one JSON object a line, are within <tools></tools>:\n<tools>",
        );
        for t in tools {
            listing.push('\n');
            listing.push_str(&t.to_string());
        }
        listing.push_str(
            "\n</tools>\n\nTo call a function, answer with a JSON object of its name and arguments within <tool_call></tool_call> tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
        );
        out.push(Message::system(match system {
            Some(m) => format!("{}\n\n{listing}", m.content),
            None => listing,
        }));
    } else if let Some(m) = system {
        out.push(m.clone());
    }
    let rest = messages.iter().skip(usize::from(system.is_some()));
    for m in rest {
        match m.role {
            Role::Assistant if !m.tool_calls.is_empty() => {
                let mut text = m.content.clone();
                for c in &m.tool_calls {
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(&format!(
                        "<tool_call>\n{{\"name\": {}, \"arguments\": {}}}\n</tool_call>",
                        Value::String(c.name.clone()),
                        c.arguments
                    ));
                }
                out.push(Message::assistant(text));
            }
            Role::Tool => {
                let block = format!("<tool_response>\n{}\n</tool_response>", m.content);
                // Results in a row share one user turn.
                match out.last_mut() {
                    Some(prev)
                        if prev.role == Role::User
                            && prev.content.ends_with("</tool_response>") =>
                    {
                        prev.content.push('\n');
                        prev.content.push_str(&block);
                    }
                    _ => out.push(Message::user(block)),
                }
            }
            _ => out.push(Message::new(m.role, m.content.clone())),
        }
    }
    out
}

/// The function name and parameter schema of an OpenAI tool (`{"type": "function",
/// "function": {"name", "parameters"}}`).
pub fn signature(tool: &Value) -> Option<(&str, Value)> {
    let f = tool.get("function")?;
    let name = f.get("name")?.as_str()?;
    let params = f
        .get("parameters")
        .cloned()
        .unwrap_or_else(|| json!({"type": "object"}));
    Some((name, params))
}

/// The control tokens that a format's forced calls are written with, by id: a grammar names
/// them as `<[id]>`, since no text can spell a control token.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallTokens {
    /// Mistral's `[TOOL_CALLS]`.
    pub tool_calls: Option<u32>,
    /// Mistral Small 3.2's `[ARGS]`, when the template writes calls as `name[ARGS]{…}`
    /// (Nemo's write a JSON array of call objects instead).
    pub args: Option<u32>,
}

/// A Lark grammar (llguidance's) that lets the model write only calls of `tools`, in
/// `format`: one call, or one or more when `parallel`. Each call's arguments follow the
/// tool's parameter schema, written compactly. `None` where the format has no grammar yet
/// (harmony), or its control tokens are missing from `tokens`.
pub fn grammar(
    format: ToolFormat,
    tools: &[(String, Value)],
    parallel: bool,
    tokens: CallTokens,
) -> Option<String> {
    let compact =
        json!({ "whitespace_flexible": false, "item_separator": ", ", "key_separator": ": " });
    let arguments = |params: &Value| {
        let mut params = params.clone();
        if let Value::Object(m) = &mut params {
            // The arguments are an object even where the schema forgot to say so.
            m.entry("type").or_insert_with(|| json!("object"));
        }
        params
    };
    let object = |name: &str, params: &Value, args_key: &str| {
        json!({
            "type": "object",
            "properties": { "name": { "const": name }, args_key: arguments(params) },
            "required": ["name", args_key],
            "additionalProperties": false,
            "x-guidance": compact,
        })
    };
    let token = |id: Option<u32>| id.map(|id| format!("<[{id}]>"));
    // Several calls, joined as the format joins them.
    let calls = |sep: &str| match parallel {
        true => format!("call ({sep} call)*"),
        false => "call".to_owned(),
    };
    // Each format: the whole (`start`), one call (`call`), and each tool's body.
    type Body<'a> = Box<dyn Fn(&str, &Value) -> String + 'a>;
    let (start, call, body): (String, String, Body) = match format {
        ToolFormat::Hermes => (
            calls(r#""\n""#),
            r#""<tool_call>\n" body "\n</tool_call>""#.into(),
            Box::new(|n, p| format!("%json {}", object(n, p, "arguments"))),
        ),
        ToolFormat::Llama3 => (
            calls(r#""; ""#),
            "body".into(),
            Box::new(|n, p| format!("%json {}", object(n, p, "parameters"))),
        ),
        // Small 3.2, Devstral: `[TOOL_CALLS]name[ARGS]{…}` for each call.
        ToolFormat::Mistral if tokens.args.is_some() => {
            let args = token(tokens.args)?;
            (
                calls(""),
                format!("{} body", token(tokens.tool_calls)?),
                Box::new(move |n, p| {
                    let name = serde_json::to_string(n).unwrap_or_default();
                    let mut schema = arguments(p);
                    if let Value::Object(m) = &mut schema {
                        m.entry("x-guidance").or_insert_with(|| compact.clone());
                    }
                    format!("{name} {args} %json {schema}")
                }),
            )
        }
        // Nemo, 7B v0.3: `[TOOL_CALLS][{"name": …, "arguments": {…}}, …]`.
        ToolFormat::Mistral => (
            format!(
                r#"{} "[" {} "]""#,
                token(tokens.tool_calls)?,
                calls(r#"", ""#)
            ),
            "body".into(),
            Box::new(|n, p| format!("%json {}", object(n, p, "arguments"))),
        ),
        ToolFormat::Harmony => return None,
    };
    let mut lark = format!("start: {start}\ncall: {call}\n");
    let bodies: Vec<String> = (0..tools.len()).map(|i| format!("body{i}")).collect();
    lark.push_str(&format!("body: {}\n", bodies.join(" | ")));
    for (i, (name, params)) in tools.iter().enumerate() {
        lark.push_str(&format!("body{i}: {}\n", body(name, params)));
    }
    Some(lark)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::ToolCall;

    #[test]
    fn a_plain_template_gets_the_tools_and_results_in_hermes_form() {
        let tools = vec![
            json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}),
        ];
        let mut call = Message::assistant("");
        call.tool_calls.push(ToolCall {
            id: "abc".into(),
            name: "get_weather".into(),
            arguments: r#"{"city": "Paris"}"#.into(),
        });
        let conversation = [
            Message::system("Be brief."),
            Message::user("Weather in Paris?"),
            call,
            Message::tool("abc", "18 C, sunny"),
            Message::tool("abd", "no rain"),
        ];
        let out = described(&conversation, &tools);
        assert_eq!(out.len(), 4);
        assert!(out[0].content.starts_with("Be brief.\n\n# Tools"));
        assert!(out[0].content.contains(r#""name":"get_weather""#));
        assert_eq!(
            out[2].content,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
        );
        assert_eq!(out[3].role, Role::User);
        assert_eq!(
            out[3].content,
            "<tool_response>\n18 C, sunny\n</tool_response>\n<tool_response>\nno rain\n</tool_response>"
        );
    }
}
