//! Tool calls through the engine on the real SmolLM2 model (a template without tools): the
//! tools reach the prompt in the Hermes format, a forced call's grammar (Hermes and Llama 3.x)
//! gives text that the format's parser reads back into a call of the right function with
//! arguments that follow its schema, and a past call and its result render into the prompt.
//! Mistral's forced calls, which name its control tokens, run on test models that have them.

mod common;

use common::engine;
use rill_engine::tools::{prompt, Calls, ToolFormat};
use rill_engine::{
    ChatArgs, Engine, EngineConfig, GenerateRequest, Grammar, Message, SamplingParams, StopReason,
    ToolCall,
};
use serde_json::{json, Value};

fn weather() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "The weather forecast of a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer", "minimum": 1, "maximum": 7}
            },
            "required": ["city", "days"],
            "additionalProperties": false
        }
    }})
}

fn ask() -> Vec<Message> {
    vec![Message::user(
        "What is the weather in Paris for the next 3 days?",
    )]
}

/// A forced call of `get_weather` in `format`, sampled with `seed`.
fn forced(format: ToolFormat, seed: u64) -> (String, StopReason) {
    let tool = weather();
    let (name, params) = prompt::signature(&tool).unwrap();
    let grammar = prompt::grammar(
        format,
        &[(name.to_owned(), params)],
        false,
        Default::default(),
    );
    run_forced(engine(), grammar.unwrap(), seed)
}

/// The call `grammar` forces, by the model of `engine`, sampled with `seed`.
fn run_forced(engine: &Engine, grammar: String, seed: u64) -> (String, StopReason) {
    let req = GenerateRequest {
        params: SamplingParams {
            temperature: 1.0,
            seed: Some(seed),
            ..SamplingParams::default()
        },
        max_tokens: Some(100),
        grammar: Some(Grammar::ToolCalls(grammar)),
        chat: ChatArgs {
            tools: vec![weather()],
            ..ChatArgs::default()
        },
        ..GenerateRequest::chat(ask())
    };
    let out = engine
        .handle()
        .generate(req)
        .unwrap()
        .collect_blocking()
        .unwrap();
    (out.text, out.reason.unwrap())
}

fn check_call(format: ToolFormat, text: &str) {
    let read = Calls::parse(format, text);
    assert_eq!(read.calls.len(), 1, "{text:?} → {read:?}");
    assert!(read.content.is_empty(), "{read:?}");
    let call = &read.calls[0];
    assert_eq!(call.name, "get_weather");
    let args: Value = serde_json::from_str(&call.arguments).unwrap();
    let keys: Vec<&String> = args.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["city", "days"], "{args}");
    assert!(args["city"].is_string(), "{args}");
    let days = args["days"].as_i64().unwrap();
    assert!((1..=7).contains(&days), "{args}");
}

#[test]
fn a_template_without_tools_gets_them_in_its_system_message() {
    let h = engine().handle();
    let args = ChatArgs {
        tools: vec![weather()],
        ..ChatArgs::default()
    };
    let prompt = h.render_chat(&ask(), &args).unwrap();
    assert!(
        prompt.starts_with("<|im_start|>system\n# Tools"),
        "{prompt}"
    );
    assert!(prompt.contains(r#""name":"get_weather""#), "{prompt}");
    assert!(prompt.contains("<tool_call>"), "{prompt}");
    assert_eq!(h.tool_format(), ToolFormat::Hermes);
    // Without tools, the prompt is the plain one.
    assert_eq!(
        h.render_chat(&ask(), &ChatArgs::default()).unwrap(),
        h.render(&ask()).unwrap()
    );
}

#[test]
fn a_forced_hermes_call_is_read_back_into_a_valid_call() {
    for seed in 0..4 {
        let (text, reason) = forced(ToolFormat::Hermes, seed);
        assert_eq!(reason, StopReason::Stop, "{text:?}");
        assert!(
            text.starts_with("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {"),
            "{text:?}"
        );
        assert!(text.ends_with("}\n</tool_call>"), "{text:?}");
        check_call(ToolFormat::Hermes, &text);
    }
}

#[test]
fn a_forced_llama3_call_is_read_back_into_a_valid_call() {
    let (text, reason) = forced(ToolFormat::Llama3, 1);
    assert_eq!(reason, StopReason::Stop, "{text:?}");
    assert!(
        text.starts_with("{\"name\": \"get_weather\", \"parameters\": {"),
        "{text:?}"
    );
    check_call(ToolFormat::Llama3, &text);
}

#[test]
fn forced_mistral_calls_in_both_forms_are_read_back_into_valid_calls() {
    // Test models with Mistral's control tokens under Nemo's and Small 3.2's templates: a
    // grammar names `[TOOL_CALLS]` (and `[ARGS]`) by id, as no text can spell them.
    for (model, start) in [
        (
            "mistral-nemo-test.Q8_0",
            "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {",
        ),
        ("mistral-small-test.Q8_0", "[TOOL_CALLS]get_weather[ARGS]{"),
    ] {
        let engine = Engine::start(EngineConfig::new(common::test_model(model))).unwrap();
        let h = engine.handle();
        assert_eq!(h.tool_format(), ToolFormat::Mistral);
        let tool = weather();
        let (name, params) = prompt::signature(&tool).unwrap();
        for seed in 0..3 {
            let grammar = h.tool_grammar(&[(name.to_owned(), params.clone())], false);
            let (text, reason) = run_forced(&engine, grammar.unwrap(), seed);
            assert_eq!(reason, StopReason::Stop, "{model}: {text:?}");
            assert!(text.starts_with(start), "{model}: {text:?}");
            check_call(ToolFormat::Mistral, &text);
        }
        // Several calls where the client allows them: every one of them valid.
        let grammar = h.tool_grammar(&[(name.to_owned(), params.clone())], true);
        let (text, _) = run_forced(&engine, grammar.unwrap(), 7);
        let read = Calls::parse(ToolFormat::Mistral, &text);
        assert!(!read.calls.is_empty(), "{model}: {text:?}");
    }
    // Without the control tokens (SmolLM2's vocabulary) a Mistral call cannot be forced.
    assert_eq!(
        prompt::grammar(ToolFormat::Mistral, &[], false, Default::default()),
        None
    );
}

#[test]
fn a_past_call_and_its_result_render_into_the_prompt() {
    let h = engine().handle();
    let mut call = Message::assistant("");
    call.tool_calls.push(ToolCall {
        id: "abcDEF123".into(),
        name: "get_weather".into(),
        arguments: r#"{"city": "Paris", "days": 3}"#.into(),
    });
    let mut messages = ask();
    messages.push(call);
    messages.push(Message::tool("abcDEF123", r#"{"forecast": "sunny"}"#));
    let args = ChatArgs {
        tools: vec![weather()],
        ..ChatArgs::default()
    };
    let prompt = h.render_chat(&messages, &args).unwrap();
    assert!(
        prompt.contains("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call><|im_end|>"),
        "{prompt}"
    );
    assert!(
        prompt.contains("<|im_start|>user\n<tool_response>\n{\"forecast\": \"sunny\"}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"),
        "{prompt}"
    );
    // The answer after the result runs: the prompt is one the model can continue.
    let req = GenerateRequest {
        params: SamplingParams::greedy(),
        max_tokens: Some(30),
        chat: args,
        ..GenerateRequest::chat(messages)
    };
    let out = h.generate(req).unwrap().collect_blocking().unwrap();
    assert!(!out.text.trim().is_empty(), "{out:?}");
}
