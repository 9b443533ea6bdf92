//! Chat templates against Python's jinja2 (issue 14): every template of llama.cpp's
//! `models/templates/` (fetched by `scripts/fetch-llama-cpp-assets.sh`) renders, for a fixed set
//! of conversations, exactly what jinja2 set up as Hugging Face's `apply_chat_template` renders
//! (`tests/fixtures/chat-templates.json`, made by `scripts/render-chat-templates.py`); where
//! jinja2 refuses a conversation (a template without a system role), Rill refuses it too.
//! Two of the conversations offer tools and carry a call and its result (issue 16): the
//! call's arguments arrive as JSON text, as Rill's API gets them, and must reach each
//! template as the object Hugging Face gives it.

mod common;

use std::path::PathBuf;

use rill_engine::template::{ChatTemplate, Message, RenderOptions, Role, ToolCall};
use serde_json::Value;

fn templates() -> PathBuf {
    common::llama_cpp_assets().join("templates")
}

fn fixtures() -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat-templates.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn messages(v: &Value) -> Vec<Message> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let role = match m["role"].as_str().unwrap() {
                "system" => Role::System,
                "user" => Role::User,
                "tool" => Role::Tool,
                _ => Role::Assistant,
            };
            let mut message = Message::new(role, m["content"].as_str().unwrap());
            message.tool_call_id = m["tool_call_id"].as_str().map(str::to_owned);
            message.reasoning = m["reasoning_content"].as_str().map(str::to_owned);
            // Calls arrive as OpenAI's API gives them, the arguments as JSON text.
            for c in m["tool_calls"].as_array().into_iter().flatten() {
                message.tool_calls.push(ToolCall {
                    id: c["id"].as_str().unwrap().to_owned(),
                    name: c["function"]["name"].as_str().unwrap().to_owned(),
                    arguments: c["function"]["arguments"].to_string(),
                });
            }
            message
        })
        .collect()
}

#[test]
fn every_template_renders_byte_for_byte_as_jinja2_does() {
    let f = fixtures();
    let now =
        chrono::NaiveDateTime::parse_from_str(f["now"].as_str().unwrap(), "%Y-%m-%dT%H:%M:%S")
            .unwrap();
    let (bos, eos) = (
        f["bos_token"].as_str().unwrap(),
        f["eos_token"].as_str().unwrap(),
    );
    let dir = templates();
    let (mut same, mut total, mut wrong) = (0, 0, Vec::new());
    let mut tools_needed = std::collections::BTreeSet::new();
    let mut quirks = std::collections::BTreeSet::new();
    for case in f["cases"].as_array().unwrap() {
        let name = case["template"].as_str().unwrap();
        let source = std::fs::read_to_string(dir.join(name)).unwrap();
        total += 1;
        let compiled = match ChatTemplate::with_clock(Some(&source), bos, eos, Some(now)) {
            Ok(t) => t,
            Err(e) => {
                wrong.push(format!("{name}: does not compile: {e}"));
                continue;
            }
        };
        let conversation = case["conversation"].as_str().unwrap();
        let with_tools = f["with_tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c == conversation);
        let options = RenderOptions {
            add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
            enable_thinking: case["enable_thinking"].as_bool(),
            tools: with_tools.then(|| f["tools"].as_array().unwrap().clone()),
            ..Default::default()
        };
        let got = compiled.render_with(&messages(&f["conversations"][conversation]), &options);
        let label = format!(
            "{name} [{conversation}, gen={}, think={:?}]",
            options.add_generation_prompt, options.enable_thinking
        );
        match (got, case.get("output").and_then(Value::as_str)) {
            (Ok(got), Some(want)) if got == want => same += 1,
            (Err(_), None) => same += 1, // jinja2 refused it too
            // Two jinja2 quirks Rill does not copy, with tools only: functionary-v3.1 adds
            // a string to `'…'|safe`, and jinja2's Markup then HTML-escapes the tool's JSON
            // (`&#34;name&#34;`), which no model was trained on; llama.cpp's own DeepSeek-R1
            // template hands `tools|map(…)` to `tojson`, and Python's `json.dumps` cannot
            // write jinja2's generator. Rill writes the JSON in both.
            (Ok(got), _)
                if name == "meetkai-functionary-medium-v3.1.jinja"
                    && case
                        .get("output")
                        .and_then(Value::as_str)
                        .is_some_and(|w| w.contains("&#34;")) =>
            {
                assert!(got.contains("{\"name\": \"get_weather\""), "{got}");
                quirks.insert(name.to_owned());
            }
            (Ok(got), None)
                if case["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("generator is not JSON serializable")) =>
            {
                assert!(got.contains("\"name\": \"get_weather\""), "{got}");
                quirks.insert(name.to_owned());
            }
            (Ok(got), Some(want)) => {
                let at = got
                    .chars()
                    .zip(want.chars())
                    .take_while(|(a, b)| a == b)
                    .count();
                let near = |s: &str| {
                    s.chars()
                        .skip(at.saturating_sub(20))
                        .take(60)
                        .collect::<String>()
                };
                wrong.push(format!(
                    "{label}: parts at char {at}:\n      rill  {:?}\n      jinja2 {:?}",
                    near(&got),
                    near(want)
                ));
            }
            // Three tool-use templates loop over `tools` unguarded: with no tools (None)
            // jinja2 stops with a TypeError and Hugging Face renders nothing; minijinja loops
            // over none as over an empty list. Rill renders them as without tools, on purpose.
            (Ok(_), None)
                if case["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("'NoneType' object is not iterable")) =>
            {
                tools_needed.insert(name.to_owned());
            }
            (Ok(_), None) => wrong.push(format!(
                "{label}: jinja2 refused ({}), Rill rendered",
                case["error"]
            )),
            (Err(e), Some(_)) => wrong.push(format!("{label}: {e}")),
        }
    }
    eprintln!(
        "{same} of {total} renderings equal jinja2's; rendered without tools where jinja2 needs them: {tools_needed:?}; jinja2 quirks not copied: {quirks:?}"
    );
    assert_eq!(tools_needed.len(), 3, "{tools_needed:?}");
    assert_eq!(quirks.len(), 2, "{quirks:?}");
    assert!(
        wrong.is_empty(),
        "{} differ:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}
