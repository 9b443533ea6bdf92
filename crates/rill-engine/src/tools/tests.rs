//! Each format's parser on answers written as those models write them: whole, cut at every
//! character boundary, and one character at a time, always the same calls.

use super::*;

fn call(name: &str, arguments: &str) -> ToolCall {
    ToolCall {
        id: String::new(),
        name: name.into(),
        arguments: arguments.into(),
    }
}

/// Pushes `text` to a fresh stream in the given pieces and gathers what comes out.
fn gather(format: ToolFormat, pieces: &[&str]) -> Calls {
    let mut stream = ToolStream::new(format);
    let mut all = Calls::default();
    for p in pieces {
        for piece in stream.push(p) {
            all.add(&piece);
        }
    }
    for piece in stream.finish() {
        all.add(&piece);
    }
    all
}

/// The same answer whole, in two pieces at every boundary, and a character at a time.
fn check(format: ToolFormat, text: &str, want: &Calls) {
    assert_eq!(&Calls::parse(format, text), want, "whole: {text:?}");
    for (at, _) in text.char_indices().skip(1) {
        let got = gather(format, &[&text[..at], &text[at..]]);
        assert_eq!(
            &got,
            want,
            "cut at {at}: {:?} | {:?}",
            &text[..at],
            &text[at..]
        );
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(&gather(format, &chars), want, "one character at a time");
}

fn calls(content: &str, reasoning: &str, calls: Vec<ToolCall>) -> Calls {
    Calls {
        content: content.into(),
        reasoning: reasoning.into(),
        calls,
    }
}

#[test]
fn hermes_calls_are_read_with_content_around_them() {
    // Qwen 2.5/3: one call, two calls, content before, nested and quoted braces in arguments.
    check(
        ToolFormat::Hermes,
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>",
        &calls("", "", vec![call("get_weather", r#"{"city": "Paris", "unit": "celsius"}"#)]),
    );
    check(
        ToolFormat::Hermes,
        "I'll look both up.\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"a } b \\\" {\", \"tags\": [\"x\", {\"y\": []}]}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>",
        &calls(
            "I'll look both up.",
            "",
            vec![
                call("search", r#"{"q": "a } b \" {", "tags": ["x", {"y": []}]}"#),
                call("now", "{}"),
            ],
        ),
    );
}

#[test]
fn hermes_leaves_what_is_not_a_call_as_content() {
    check(
        ToolFormat::Hermes,
        "Use <tool_call> tags like <b>this</b>.",
        &calls("Use <tool_call> tags like <b>this</b>.", "", vec![]),
    );
    check(
        ToolFormat::Hermes,
        "Plain answer, nothing to call.",
        &calls("Plain answer, nothing to call.", "", vec![]),
    );
    // An answer cut by the length limit inside the arguments keeps what arrived.
    check(
        ToolFormat::Hermes,
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"hel",
        &calls("", "", vec![call("f", "{\"a\": \"hel")]),
    );
    // Arguments before the name: the call is known when the object ends.
    check(
        ToolFormat::Hermes,
        "<tool_call>{\"arguments\": {\"x\": 1}, \"name\": \"g\"}</tool_call>",
        &calls("", "", vec![call("g", r#"{"x": 1}"#)]),
    );
}

#[test]
fn llama3_json_calls_are_read() {
    // Llama 3.1/3.2's custom tool format, with and without the python tag.
    check(
        ToolFormat::Llama3,
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Tokyo\"}}",
        &calls("", "", vec![call("get_weather", r#"{"city": "Tokyo"}"#)]),
    );
    check(
        ToolFormat::Llama3,
        "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"n\": 1}}; {\"name\": \"b\", \"parameters\": {}}",
        &calls("", "", vec![call("a", r#"{"n": 1}"#), call("b", "{}")]),
    );
    check(
        ToolFormat::Llama3,
        "The capital of Japan is Tokyo.",
        &calls("The capital of Japan is Tokyo.", "", vec![]),
    );
    check(
        ToolFormat::Llama3,
        "{\"answer\": 42}",
        &calls("{\"answer\": 42}", "", vec![]),
    );
}

#[test]
fn mistral_calls_are_read_in_both_forms() {
    // Mistral Nemo (v3 tokenizer): a JSON array after [TOOL_CALLS].
    check(
        ToolFormat::Mistral,
        "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lyon\"}, \"id\": \"abcDEF123\"}, {\"name\": \"now\", \"arguments\": {}}]",
        &calls(
            "",
            "",
            vec![call("get_weather", r#"{"city": "Lyon"}"#), call("now", "{}")],
        ),
    );
    // Mistral Small 3.2 / Devstral (v11): name, optional call id, [ARGS], arguments.
    check(
        ToolFormat::Mistral,
        "Let me check.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Nice\"}[TOOL_CALLS]now[CALL_ID]a1b2c3d4e[ARGS]{}",
        &calls(
            "Let me check.",
            "",
            vec![call("get_weather", r#"{"city": "Nice"}"#), call("now", "{}")],
        ),
    );
    check(
        ToolFormat::Mistral,
        "No tools [needed] here.",
        &calls("No tools [needed] here.", "", vec![]),
    );
}

#[test]
fn harmony_channels_become_reasoning_content_and_calls() {
    // gpt-oss after `<|start|>assistant`: analysis, then a call to a function.
    check(
        ToolFormat::Harmony,
        "<|channel|>analysis<|message|>User asks weather in SF. Call the tool.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"location\":\"San Francisco\"}<|call|>",
        &calls(
            "",
            "User asks weather in SF. Call the tool.",
            vec![call("get_weather", r#"{"location":"San Francisco"}"#)],
        ),
    );
    // The recipient before the channel, as the template writes past calls.
    check(
        ToolFormat::Harmony,
        "<|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>{\"q\": \"x<y\"}<|call|>",
        &calls("", "", vec![call("lookup", r#"{"q": "x<y"}"#)]),
    );
    // Analysis then final answer.
    check(
        ToolFormat::Harmony,
        "<|channel|>analysis<|message|>Simple sum: 2+2=4.<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = **4**.<|return|>",
        &calls("2 + 2 = **4**.", "Simple sum: 2+2=4.", vec![]),
    );
    check(
        ToolFormat::Harmony,
        "Just text.",
        &calls("Just text.", "", vec![]),
    );
}

#[test]
fn arguments_stream_after_the_name() {
    let mut s = ToolStream::new(ToolFormat::Hermes);
    let mut pieces = Vec::new();
    for part in [
        "<tool_call>\n{\"name\": \"f\", \"argu",
        "ments\": {\"a\"",
        ": 1}}\n</tool_call>",
    ] {
        pieces.extend(s.push(part));
    }
    pieces.extend(s.finish());
    assert_eq!(
        pieces,
        vec![
            Piece::CallStart {
                index: 0,
                name: "f".into()
            },
            Piece::Arguments {
                index: 0,
                text: "{\"a\"".into()
            },
            Piece::Arguments {
                index: 0,
                text: ": 1}".into()
            },
        ]
    );
}

#[test]
fn formats_are_chosen_from_the_template() {
    assert_eq!(ToolFormat::of("{{ '<tool_call>' }}"), ToolFormat::Hermes);
    assert_eq!(ToolFormat::of("[TOOL_CALLS]"), ToolFormat::Mistral);
    assert_eq!(ToolFormat::of("<|channel|>"), ToolFormat::Harmony);
    assert_eq!(
        ToolFormat::of("<|start_header_id|> {\"name\": function name, \"parameters\": …}"),
        ToolFormat::Llama3
    );
    assert_eq!(ToolFormat::of("plain"), ToolFormat::Hermes);
}

#[test]
fn call_ids_are_nine_letters_and_digits_and_differ() {
    let a = call_id(1);
    assert_eq!(a.len(), 9);
    assert!(a.chars().all(|c| c.is_ascii_alphanumeric()));
    assert_ne!(a, call_id(2));
}

/// Issue 40: a call's arguments are read once, not again at every token: 200 KB of arguments
/// a character at a time is read in about the time of one pass (reading the object from its
/// start at every token took minutes).
#[test]
fn a_long_call_is_read_in_linear_time() {
    let big = "x".repeat(200_000);
    let args = format!(r#"{{"text": "{big}", "n": [1, {{"a": "}}"}}]}}"#);
    for (format, text) in [
        (
            ToolFormat::Hermes,
            format!("<tool_call>{{\"name\": \"f\", \"arguments\": {args}}}</tool_call>"),
        ),
        (ToolFormat::Mistral, format!("[TOOL_CALLS]f[ARGS]{args}")),
        (
            ToolFormat::Harmony,
            format!("<|channel|>commentary to=functions.f <|message|>{args}<|call|>"),
        ),
    ] {
        let started = std::time::Instant::now();
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
        let got = gather(format, &chars);
        assert_eq!(got, calls("", "", vec![call("f", &args)]), "{format:?}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "{format:?}: {:?}",
            started.elapsed()
        );
    }
}

/// Issue 40: an answer that ends inside a header or a call's name shows what the model wrote.
#[test]
fn unfinished_header_or_name_text_is_shown_not_dropped() {
    let got = gather(
        ToolFormat::Harmony,
        &[
            "<|channel|>analysis<|message|>Hm.<|end|>",
            "<|start|>assistant<|chan",
        ],
    );
    assert_eq!(got, calls("<|start|>assistant<|chan", "Hm.", vec![]));
    let got = gather(ToolFormat::Mistral, &["Sure. [TOOL_CALLS]get_wea"]);
    assert_eq!(got, calls("Sure. [TOOL_CALLS]get_wea", "", vec![]));
}
