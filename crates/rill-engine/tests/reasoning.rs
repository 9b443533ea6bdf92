//! Reasoning apart from content, through the engine (issue 16): a qwen2 test model (seeded
//! random weights, `scripts/make-test-models.py`) under the real DeepSeek-R1-Distill-Qwen
//! template, which opens the thinking block itself. A random-weight model never closes its own
//! block, so the thinking budget closes it.

mod common;

use common::{llama_cpp_assets, test_model};
use rill_engine::template::{ChatTemplate, RenderOptions};
use rill_engine::{
    Engine, EngineConfig, Event, GenerateRequest, Message, Prompt, SamplingParams, StopReason,
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
