//! A system prompt works with every model (issue 41, templates as llama.cpp's server runs
//! them): a template that refuses the system role (Gemma 2's raises "System role not
//! supported") gets the system text joined to the first user message with a newline, as
//! llama.cpp's chat code does; a template that takes one (ChatML) is rendered as it was.

mod common;

use rill_engine::{Engine, EngineConfig, Event, GenerateRequest, Message, SamplingParams};

#[test]
fn a_system_prompt_goes_into_the_first_user_turn_where_the_template_refuses_it() {
    let engine = Engine::start(EngineConfig::new(common::test_model("gemma2-test.Q8_0"))).unwrap();
    let handle = engine.handle();
    let chat = [
        Message::system("Be brief."),
        Message::user("Hi"),
        Message::assistant("Hello."),
        Message::user("How are you?"),
    ];
    // The template itself still refuses it.
    let templates = common::llama_cpp_assets().join("templates");
    let template = rill_engine::template::ChatTemplate::new(
        Some(&std::fs::read_to_string(templates.join("google-gemma-2-2b-it.jinja")).unwrap()),
        "<bos>",
        "<eos>",
    )
    .unwrap();
    let refused = template.render(&chat, true).unwrap_err().to_string();
    assert!(refused.contains("System role not supported"), "{refused}");
    assert!(!template.system_role());
    assert_eq!(
        handle.render(&chat).unwrap(),
        "<s><start_of_turn>user\nBe brief.\nHi<end_of_turn>\n<start_of_turn>model\n\
         Hello.<end_of_turn>\n<start_of_turn>user\nHow are you?<end_of_turn>\n\
         <start_of_turn>model\n"
    );
    // And an answer streams.
    let mut req = GenerateRequest::chat(chat.to_vec());
    req.params = SamplingParams::greedy();
    req.max_tokens = Some(4);
    let events: Vec<Event> = handle.generate(req).unwrap().collect();
    assert!(
        matches!(events.last(), Some(Event::Done { usage, .. }) if usage.completion_tokens > 0),
        "{events:?}"
    );
}

#[test]
fn a_template_that_takes_a_system_prompt_keeps_it_as_its_own_turn() {
    let engine = Engine::start(EngineConfig::new(common::model_path())).unwrap();
    let text = engine
        .handle()
        .render(&[Message::system("Be brief."), Message::user("Hi")])
        .unwrap();
    assert!(
        text.starts_with("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>"),
        "{text}"
    );
}
