//! Reasoning apart from content, through the engine (issue 16): a qwen2 test model (seeded
//! random weights, `scripts/make-test-models.py`) under the real DeepSeek-R1-Distill-Qwen
//! template, which opens the thinking block itself. A random-weight model never closes its own
//! block, so the thinking budget closes it.

mod common;

use common::{llama_cpp_assets, test_model};
use rill_engine::template::{ChatTemplate, RenderOptions};
use rill_engine::{
    Engine, EngineConfig, Event, GenerateRequest, Grammar, Message, Prompt, SamplingParams,
    StopReason, Thinking,
};

/// The DeepSeek-R1 distill's prompt for one question, thinking on: it ends in `<think>\n`.
fn deepseek_prompt() -> String {
    let path = llama_cpp_assets().join("templates/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja");
    let source = std::fs::read_to_string(&path).unwrap();
    let t = ChatTemplate::new(Some(&source), "", "<｜end▁of▁sentence｜>").unwrap();
    let options = RenderOptions {
        add_generation_prompt: true,
        enable_thinking: Some(true),
        ..Default::default()
    };
    let prompt = t
        .render_with(&[Message::user("What is 17 times 3?")], &options)
        .unwrap();
    assert!(prompt.ends_with("<think>\n"), "{prompt:?}");
    prompt
}

struct Answer {
    ids: Vec<u32>,
    content: String,
    reasoning: String,
    /// Each token event's (content, reasoning).
    events: Vec<(String, String)>,
    reason: StopReason,
}

fn answer(engine: &Engine, budget: Option<usize>, max: usize) -> Answer {
    let req = GenerateRequest {
        params: SamplingParams::greedy(),
        max_tokens: Some(max),
        split_reasoning: true,
        thinking_budget: budget,
        ..GenerateRequest::new(Prompt::Text(deepseek_prompt()))
    };
    collect(engine, req)
}

fn collect(engine: &Engine, req: GenerateRequest) -> Answer {
    let mut a = Answer {
        ids: Vec::new(),
        content: String::new(),
        reasoning: String::new(),
        events: Vec::new(),
        reason: StopReason::Cancelled,
    };
    for ev in engine.handle().generate(req).unwrap() {
        match ev {
            Event::Token {
                id,
                text,
                reasoning,
                ..
            } => {
                a.ids.push(id);
                a.content.push_str(&text);
                a.reasoning.push_str(&reasoning);
                a.events.push((text, reasoning));
            }
            Event::Done { reason, usage, .. } => {
                a.ids.truncate(usage.completion_tokens);
                a.reason = reason;
            }
            _ => {}
        }
    }
    a
}

#[test]
fn a_budget_of_16_closes_the_block_after_16_tokens_and_the_answer_goes_on() {
    let engine = Engine::start(EngineConfig::new(test_model("qwen2-test.Q8_0"))).unwrap();
    let handle = engine.handle();
    let tok = handle.tokenizer();
    let a = answer(&engine, Some(16), 48);
    assert_eq!(a.reason, StopReason::Length);
    assert_eq!(a.ids.len(), 48);
    let close = tok.encode_with("\n</think>\n\n", false).unwrap();
    // The 16 budgeted tokens, then the block's end, then the answer.
    assert_eq!(&a.ids[16..16 + close.len()], &close[..]);
    let thought = tok.decode(&a.ids[..16]);
    assert_eq!(a.reasoning, format!("{}\n", thought.trim_start()));
    let rest = tok.decode(&a.ids[16 + close.len()..]);
    assert_eq!(a.content, rest.trim_start());
    assert!(
        !a.content.is_empty() && !a.content.contains("think>"),
        "{:?}",
        a.content
    );
    // While thinking, the events carry no content; after it, no reasoning.
    let first_content = a.events.iter().position(|(c, _)| !c.is_empty()).unwrap();
    assert!(a.events[..first_content].iter().all(|(c, _)| c.is_empty()));
    assert!(a.events[first_content..].iter().all(|(_, r)| r.is_empty()));

    // Without a budget the random model thinks on until the limit: all of it is reasoning.
    let free = answer(&engine, None, 24);
    assert_eq!(free.content, "");
    assert_eq!(free.reasoning, tok.decode(&free.ids).trim_start());
    // Its first 16 tokens are the budgeted answer's: closing the block changed nothing before.
    assert_eq!(free.ids[..16], a.ids[..16]);
}

#[test]
fn a_budget_with_no_room_left_for_the_blocks_end_ends_the_answer_as_context_full() {
    let model = test_model("qwen2-test.Q8_0");
    let probe = Engine::start(EngineConfig::new(&model)).unwrap();
    let prompt_len = probe
        .handle()
        .tokenize_prompt(&Prompt::Text(deepseek_prompt()))
        .unwrap()
        .len();
    drop(probe);
    // Room for the 16 budgeted tokens and two more: not for `\n</think>\n\n` and an answer.
    let engine = Engine::start(EngineConfig {
        context_size: Some(prompt_len + 18),
        ..EngineConfig::new(&model)
    })
    .unwrap();
    let a = answer(&engine, Some(16), 100);
    assert_eq!(a.reason, StopReason::ContextFull);
    assert_eq!(a.ids.len(), 16);
    assert_eq!(a.content, "");
}

/// A schema for the answer after the thinking.
fn verdict() -> Grammar {
    Grammar::JsonSchema(serde_json::json!({
        "type": "object",
        "properties": {"product": {"type": "integer"}, "sure": {"type": "boolean"}},
        "required": ["product", "sure"],
        "additionalProperties": false
    }))
}

fn check_verdict(a: &Answer) {
    let v: serde_json::Value = serde_json::from_str(&a.content).unwrap_or_else(|e| {
        panic!(
            "the answer after the thinking is not JSON ({e}): {:?}",
            a.content
        )
    });
    // An integer, as JSON Schema counts them (`-2.8e+105` is one).
    let product = v["product"].as_f64().unwrap_or(0.5);
    assert!(product.fract() == 0.0 && v["sure"].is_boolean(), "{v}");
    assert_eq!(a.reason, StopReason::Stop, "the grammar ends the answer");
}

#[test]
fn a_grammar_waits_for_the_thinking_block_to_close_and_shapes_the_answer_after_it() {
    let engine = Engine::start(EngineConfig::new(test_model("qwen2-test.Q8_0"))).unwrap();
    let constrained = |budget| {
        collect(
            &engine,
            GenerateRequest {
                grammar: Some(verdict()),
                max_tokens: Some(200),
                split_reasoning: true,
                thinking_budget: Some(budget),
                params: SamplingParams::greedy(),
                ..GenerateRequest::new(Prompt::Text(deepseek_prompt()))
            },
        )
    };
    let a = constrained(8);
    // The thinking is the model's own, as without a grammar: the same 8 tokens.
    let free = answer(&engine, Some(8), 12);
    assert_eq!(a.reasoning, free.reasoning);
    assert_eq!(a.ids[..8], free.ids[..8]);
    check_verdict(&a);
}

#[test]
fn a_thinking_template_that_leaves_the_block_to_its_model_gets_it_opened_under_a_grammar() {
    // Qwen3's template: the model writes `<think>` itself, which a grammar from the first token
    // would forbid. The engine opens the block, the budget closes it, the grammar shapes the rest.
    let engine = Engine::start(EngineConfig::new(test_model("qwen3-test.Q8_0"))).unwrap();
    let ask = |think: Option<bool>| {
        let mut req = GenerateRequest {
            grammar: Some(verdict()),
            max_tokens: Some(200),
            split_reasoning: true,
            thinking_budget: Some(6),
            params: SamplingParams::greedy(),
            ..GenerateRequest::chat(vec![Message::user("What is 17 times 3?")])
        };
        if let Some(on) = think {
            req.chat.kwargs.insert("enable_thinking".into(), on.into());
        }
        collect(&engine, req)
    };
    for think in [None, Some(true)] {
        let a = ask(think);
        assert!(!a.reasoning.trim().is_empty(), "{think:?}: no thinking");
        check_verdict(&a);
    }
    // Thinking turned off: the template writes the empty block, the answer is JSON at once.
    let a = ask(Some(false));
    assert_eq!(a.reasoning, "");
    check_verdict(&a);
}

#[test]
fn templates_say_how_their_models_think() {
    let thinking = |name: &str| {
        let source =
            std::fs::read_to_string(llama_cpp_assets().join("templates").join(name)).unwrap();
        ChatTemplate::new(Some(&source), "<s>", "</s>")
            .unwrap()
            .thinking()
    };
    // Thinks unless `enable_thinking` is false.
    assert_eq!(thinking("Qwen-Qwen3-0.6B.jinja"), Thinking::Optional);
    // llama.cpp's version opens the block and closes it again unless `enable_thinking` is true.
    assert_eq!(
        thinking("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"),
        Thinking::OnRequest
    );
    assert_eq!(thinking("Qwen-QwQ-32B.jinja"), Thinking::OnRequest);
    // Opens the block whatever it is told.
    assert_eq!(
        thinking("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja"),
        Thinking::Always
    );
    assert_eq!(
        thinking("meta-llama-Llama-3.2-3B-Instruct.jinja"),
        Thinking::None
    );
    // gpt-oss's harmony always starts with its analysis channel.
    assert_eq!(thinking("openai-gpt-oss-120b.jinja"), Thinking::Always);
    // A listing runs no template (issue 40): how a file thinks is known once it loads.
    let info = rill_engine::inspect(&test_model("gpt-oss-test.MXFP4")).unwrap();
    assert!(
        info.runs && info.family == "gpt-oss" && info.thinking.is_none(),
        "{info:?}"
    );
    let loaded = |name: &str| {
        rill_engine::model::Model::load(&test_model(name), &candle_core::Device::Cpu, Some(256))
            .unwrap()
            .info
            .thinking
    };
    assert_eq!(loaded("gpt-oss-test.MXFP4"), Some(Thinking::Always));
    // And the test model's file says so.
    assert_eq!(
        loaded("deepseek-r1-qwen-test.Q8_0"),
        Some(Thinking::OnRequest)
    );
    assert!(Thinking::OnRequest.on(Some(true)) && !Thinking::OnRequest.on(None));
    assert!(Thinking::Optional.on(None) && !Thinking::Optional.on(Some(false)));
}
