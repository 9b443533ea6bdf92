//! A model file's chat template cannot take the process down (issue 40). Each template the
//! issue measured crashing or hanging Rill (a namespace holding itself through `tojson`, a
//! dictionary nested 90,000 deep, `{%}`, `strftime_now('%Z')`, two nested `range(100000)`
//! loops, `tojson(indent=1000000000)`) is an error here, named for its model, in bounded time;
//! and templates made from llama.cpp's real ones by mutation go through listing, loading and
//! rendering with no crash and no hang.
//!
//! The fuzz run's case count comes from `RILL_TEMPLATE_FUZZ_CASES` (2,000 by default); docs/tests.md
//! gives the command for a long run.

mod common;

use std::io::Cursor;
use std::time::{Duration, Instant};

use candle_core::quantized::gguf_file::Value;
use common::gguf_craft;
use rill_engine::template::{ChatTemplate, Message, RenderOptions};

/// The templates the issue measured, each with what it did before, and whether it runs into a
/// limit (so loading refuses its model) or fails as a template may (so its model loads and each
/// render is a clear error).
const HOSTILE: &[(&str, &str, bool)] = &[
    (
        "a namespace holding itself, through tojson (stack overflow)",
        "<think>{% set ns = namespace(a=1) %}{% set ns.me = ns %}{{ ns | tojson }}",
        true,
    ),
    (
        "a dictionary nested 90,000 deep, through tojson (stack overflow)",
        "<think>{% set ns = namespace(d={}) %}{% for i in range(90000) %}{% set ns.d = {'a': ns.d} %}{% endfor %}{{ ns.d | tojson }}",
        true,
    ),
    (
        "the same, printed (stack overflow)",
        "<think>{% set ns = namespace(d={}) %}{% for i in range(90000) %}{% set ns.d = {'a': ns.d} %}{% endfor %}{{ ns.d }}",
        true,
    ),
    (
        "the same, through |string and |pprint",
        "<think>{% set ns = namespace(d=[]) %}{% for i in range(5000) %}{% set ns.d = [ns.d] %}{% endfor %}{{ ns.d | string }}{{ ns.d | pprint }}",
        true,
    ),
    (
        "an empty tag (panic)",
        "<think>{%}",
        true,
    ),
    (
        "strftime_now('%Z') (panic)",
        "<think>{{ strftime_now('%Z') }}",
        false,
    ),
    (
        "two nested range(100000) loops (no answer in 60 s)",
        "<think>{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        true,
    ),
    (
        "tojson(indent=1000000000) (no answer in 60 s)",
        "<think>{{ messages | tojson(indent=1000000000) }}",
        true,
    ),
    (
        "100 MB of output",
        "<think>{% for i in range(1000) %}{{ 'x' * 100000 }}{% endfor %}",
        true,
    ),
    (
        "a macro calling itself",
        "<think>{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}",
        false,
    ),
];

/// Within this, every template returns.
const DEADLINE: Duration = Duration::from_secs(30);

fn with_template(source: &str) -> Vec<u8> {
    let mut craft = gguf_craft::small();
    gguf_craft::set(
        &mut craft,
        "tokenizer.chat_template",
        Value::String(source.into()),
    );
    craft.bytes()
}

fn question() -> Vec<Message> {
    vec![Message::system("Be brief."), Message::user("2 + 2?")]
}

#[test]
fn each_measured_hostile_template_is_an_error_in_bounded_time() {
    for (what, source, _) in HOSTILE {
        let started = Instant::now();
        let rendered = ChatTemplate::new(Some(source), "<s>", "</s>")
            .and_then(|t| t.render(&question(), true));
        let took = started.elapsed();
        let err = rendered.expect_err(what).to_string();
        println!("{what}: {took:?}: {err}");
        assert!(took < DEADLINE, "{what} took {took:?}");
        assert!(err.starts_with("chat template: "), "{what}: {err}");
    }
}

#[test]
fn a_model_whose_template_fails_is_refused_by_name_at_load_and_listed_with_it() {
    let dir = tempfile::tempdir().unwrap();
    for (i, (what, source, limit)) in HOSTILE.iter().enumerate() {
        let bytes = with_template(source);
        let path = dir.path().join(format!("hostile-{i}.gguf"));
        std::fs::write(&path, &bytes).unwrap();
        let started = Instant::now();
        // Loading: the model's own error, naming its template, when it runs into a limit (or
        // does not compile); else it loads, and each render is the template's clear error.
        let loaded = rill_engine::model::check(&mut Cursor::new(&bytes), bytes.len() as u64, &path);
        match (*limit || source.contains("{%}"), loaded) {
            (true, Err(e)) => {
                let e = e.to_string();
                assert!(
                    e.contains("hostile-") && e.contains("its chat template fails: "),
                    "{what}: {e}"
                );
            }
            (false, Ok(_)) => {}
            (refused, got) => panic!("{what}: refused {refused}, got {got:?}"),
        }
        // Listing runs no template: a file whose template compiles lists, one that does not
        // compile lists with that error; neither crashes nor hangs.
        match rill_engine::inspect(&path) {
            Ok(info) => assert!(info.runs && info.thinking.is_none(), "{what}: {info:?}"),
            Err(e) => assert!(e.to_string().contains("its chat template fails"), "{e}"),
        }
        assert!(started.elapsed() < DEADLINE, "{what}");
    }
    // Beside them, the real model lists with its template's thinking unknown until it loads,
    // and loads.
    let real = common::model_path();
    assert_eq!(rill_engine::inspect(&real).unwrap().thinking, None);
    let model =
        rill_engine::model::Model::load(&real, &candle_core::Device::Cpu, Some(256)).unwrap();
    assert_eq!(
        model.info.thinking,
        Some(rill_engine::template::Thinking::None)
    );
}

#[test]
fn a_template_longer_than_a_megabyte_is_refused() {
    let source = "x".repeat(2 << 20);
    let err = ChatTemplate::new(Some(&source), "", "")
        .unwrap_err()
        .to_string();
    assert!(err.contains("longer than"), "{err}");
}

/// Inserted by the mutator: pieces of Jinja, and the hostile ones above.
const FRAGMENTS: &[&str] = &[
    "{%",
    "%}",
    "{{",
    "}}",
    "{%}",
    "{% endfor %}",
    "{% endif %}",
    "{% for m in messages %}",
    "{% for i in range(100000) %}",
    "{% if %}",
    "{{ messages | tojson(indent=99) }}",
    "{{ tools | tojson }}",
    "{% set ns = namespace(x=1) %}{% set ns.x = ns %}{{ ns }}",
    "{{ strftime_now('%Z %Q %') }}",
    "{{ 'ab' * 99999999 }}",
    "{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}",
    "{{ raise_exception('no') }}",
    "{{ messages[0]['content'][::-1] }}",
    "{% generation %}",
    "{{ x.y.z() }}",
    "|",
    "'",
    "\"",
    "(",
];

/// A small seeded generator (xorshift): the same cases every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// The nearest char boundary at or before `at`.
fn boundary(s: &str, mut at: usize) -> usize {
    at = at.min(s.len());
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// One to three edits: a run deleted, a run repeated, a fragment inserted, two runs swapped.
fn mutate(source: &str, rng: &mut Rng) -> String {
    let mut s = source.to_owned();
    for _ in 0..1 + rng.below(3) {
        let a = boundary(&s, rng.below(s.len() + 1));
        let b = boundary(&s, a + rng.below(40)).max(a);
        match rng.below(4) {
            0 => {
                s.replace_range(a..b, "");
            }
            1 => {
                let run = s[a..b].to_owned();
                s.insert_str(b, &run);
            }
            2 => s.insert_str(a, FRAGMENTS[rng.below(FRAGMENTS.len())]),
            _ => {
                let c = boundary(&s, rng.below(s.len() + 1));
                let d = boundary(&s, c + rng.below(40)).max(c);
                if b <= c {
                    let (x, y) = (s[a..b].to_owned(), s[c..d].to_owned());
                    s.replace_range(c..d, &x);
                    s.replace_range(a..b, &y);
                }
            }
        }
    }
    s
}

/// The fuzz run: real templates mutated, each through listing (a file on disk), loading (every
/// check the loader makes) and rendering a conversation with tools and a call. Every case
/// returns, within the deadline.
#[test]
fn mutated_real_templates_never_crash_or_hang_listing_loading_or_rendering() {
    let dir = common::llama_cpp_assets().join("templates");
    let mut sources: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jinja"))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    sources.sort();
    assert!(
        sources.len() > 50,
        "llama.cpp's templates: {}",
        dir.display()
    );
    sources.extend(HOSTILE.iter().map(|(_, s, _)| s.to_string()));
    let cases: usize = std::env::var("RILL_TEMPLATE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("fuzzed.gguf");
    let tools = vec![serde_json::json!({"type": "function", "function": {
        "name": "get_weather", "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})];
    let mut call = Message::assistant("");
    call.tool_calls.push(rill_engine::template::ToolCall {
        id: "c1".into(),
        name: "get_weather".into(),
        arguments: r#"{"city": "Paris"}"#.into(),
    });
    let conversation = vec![
        Message::system("Be brief."),
        Message::user("Weather in Paris?"),
        call,
        Message::tool("c1", "Sunny"),
        Message::user("Thanks!"),
    ];
    let options = RenderOptions {
        add_generation_prompt: true,
        enable_thinking: Some(true),
        tools: Some(tools),
        ..Default::default()
    };
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut rendered, mut slowest) = (0, Duration::ZERO);
    let started = Instant::now();
    for case in 0..cases {
        let source = mutate(&sources[rng.below(sources.len())], &mut rng);
        let at = Instant::now();
        let bytes = with_template(&source);
        std::fs::write(&path, &bytes).unwrap();
        let _ = rill_engine::inspect(&path);
        let _ = rill_engine::model::check(&mut Cursor::new(&bytes), bytes.len() as u64, &path);
        if let Ok(t) = ChatTemplate::new(Some(&source), "<s>", "</s>") {
            let with_tools = t.render_with(&conversation, &options).is_ok();
            let plain = t.render(&question(), true).is_ok();
            rendered += usize::from(with_tools || plain);
            let _ = t.thinking();
        }
        let took = at.elapsed();
        assert!(took < DEADLINE, "case {case} took {took:?}:\n{source}");
        slowest = slowest.max(took);
    }
    println!(
        "{cases} mutated templates in {:?} ({rendered} rendered; slowest case {slowest:?})",
        started.elapsed()
    );
    // Mutations leave many templates working: the run reaches rendering, not only the parser.
    assert!(rendered * 5 > cases, "only {rendered} of {cases} rendered");
}

/// No template of llama.cpp's folder runs into a limit on the one question loading checks a
/// template with, nor on a long conversation.
#[test]
fn every_real_template_renders_a_long_conversation_within_its_fuel() {
    // The fuel is far above what real templates need: a system prompt and 100 exchanges, on
    // every template of llama.cpp's folder, render (or are refused as jinja2 would refuse them,
    // by raise_exception), never run out.
    let dir = common::llama_cpp_assets().join("templates");
    let mut turns = vec![Message::system("Be brief.")];
    for i in 0..100 {
        turns.push(Message::user(format!("Question {i}?")));
        turns.push(Message::assistant(format!("Answer {i}.")));
    }
    turns.push(Message::user("Last?"));
    for entry in std::fs::read_dir(&dir).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_none_or(|x| x != "jinja") {
            continue;
        }
        let t =
            ChatTemplate::new(Some(&std::fs::read_to_string(&p).unwrap()), "<s>", "</s>").unwrap();
        // What loading renders to check a template: one question. No real template runs into
        // a limit on it (some refuse it: firefunction-v2 needs variables a client passes).
        let limit = |r: rill_engine::Result<String>| {
            if let Err(e @ rill_engine::Error::TemplateLimit(_)) = r {
                panic!("{}: {e}", p.display());
            }
        };
        limit(t.render(&[Message::user("2 + 2?")], true));
        limit(t.render(&turns, true));
    }
}
