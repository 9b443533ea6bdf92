//! The flow's memory on the real model: the KV budget queues, evicts and preempts without
//! losing an answer, prefix reuse carries a conversation's cache to its next turn, and a
//! conversation longer than the context drops its oldest turns or stops.

mod common;

use std::time::Duration;

use common::flow::{engine, greedy, take_tokens, wait_until, LONG, SHORT};
use rill_engine::{
    EngineConfig, Error, Event, GenerateRequest, Handle, Message, Overflow, Prompt, SamplingParams,
    StopReason,
};

/// SmolLM2's KV cache per position: K and V, 30 layers, 3 KV heads of 64, in f16.
const KV_PER_TOKEN: usize = 2 * 30 * 3 * 64 * 2;

#[test]
fn a_follow_up_turn_reuses_the_cache_of_the_first() {
    let e = engine(|c| c);
    let h = e.handle();
    let turn1 = vec![Message::user("Hi, my name is Ana. Tell me about Lisbon.")];
    let prompt1 = h
        .tokenize_prompt(&Prompt::Messages(turn1.clone()))
        .unwrap()
        .len();
    let mut req = greedy("", 24);
    req.prompt = Prompt::Messages(turn1.clone());
    req.ignore_eos = false;
    let answer = h.generate(req.clone()).unwrap().collect_blocking().unwrap();
    // Kept once the engine retires the answer, just after its Done event.
    wait_until("the finished answer's cache to be kept", || {
        h.prefix_cache_bytes() > 0
    });

    // The sampling panel previews the regenerate position (turn 1's prompt) as sliders move;
    // looking must not take the conversation's kept cache apart.
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for temperature in [0.7, 0.3] {
        let preview = rt
            .block_on(h.preview(rill_engine::PreviewRequest {
                prompt: Prompt::Messages(turn1.clone()),
                params: SamplingParams {
                    temperature,
                    ..Default::default()
                },
                top: 8,
            }))
            .unwrap();
        assert_eq!(preview.candidates.len(), 8);
    }

    let mut turn2 = turn1;
    turn2.push(Message::assistant(answer.text.clone()));
    turn2.push(Message::user("What is my name?"));
    req.prompt = Prompt::Messages(turn2);
    let mut gen = h.generate(req).unwrap();
    let reused = gen.find_map(|e| {
        if let Event::Started { reused_tokens, .. } = e {
            Some(reused_tokens)
        } else {
            None
        }
    });
    let reused = reused.unwrap();
    assert!(
        reused >= prompt1 + answer.ids.len() / 2,
        "turn 2 reused {reused} tokens; turn 1 had {prompt1} + {}",
        answer.ids.len()
    );
}

#[test]
fn a_full_budget_queues_new_requests_and_evicts_paused_caches() {
    // Room for about one sequence of this size: 300 positions of this model's KV cache.
    let e = engine(|c| EngineConfig {
        kv_budget: Some(300 * KV_PER_TOKEN),
        ..c
    });
    let h = e.handle();

    let mut first = h.generate(greedy(LONG, 40)).unwrap();
    take_tokens(&mut first, 1);
    let mut second = h.generate(greedy(SHORT, 8)).unwrap();
    let position = second.find_map(|e| match e {
        Event::Queued { position } => Some(position),
        Event::Started { .. } => panic!("admitted beyond the budget"),
        _ => None,
    });
    assert_eq!(position, Some(0));
    // The second starts once the first is done and gives its memory back.
    first.collect_blocking().unwrap();
    assert!(second.collect_blocking().unwrap().text.contains("Paris"));

    // A paused answer gives its cache up for a new request and is recomputed on resume.
    let mut paused = h.generate(greedy(LONG, 30)).unwrap();
    let mut ids = take_tokens(&mut paused, 10);
    paused.pause().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let other = h
        .generate(greedy(SHORT, 8))
        .unwrap()
        .collect_blocking()
        .unwrap();
    assert!(other.text.contains("Paris"));
    wait_until("the evicted cache to be gone", || h.cache_bytes() == 0);
    paused.resume().unwrap();
    let rest = paused.collect_blocking().unwrap().ids;
    ids.extend(&rest);
    assert_eq!(ids.len(), 30);

    // Recomputing runs the answer so far as a prefill chunk, and step-by-step decoding and one
    // batched prefill can part on a near-tie (llama.cpp's do too); the text already shown never
    // changes. So check each later token against the model directly: it is the most likely
    // next token, or within a hair of it.
    let mut context = h
        .tokenize_prompt(&Prompt::Messages(vec![Message::user(LONG)]))
        .unwrap();
    context.extend(&ids[..ids.len() - rest.len()]);
    common::assert_greedy_continuation(&context, &rest);
}

#[test]
fn a_conversation_longer_than_the_context_drops_its_oldest_turns_or_stops() {
    let e = engine(|c| EngineConfig {
        context_size: Some(160),
        ..c
    });
    let h: Handle = e.handle();
    let mut messages = vec![Message::system("You are brief.")];
    for i in 0..8 {
        messages.push(Message::user(format!(
            "Tell me fact number {i} about the sea, please, in detail."
        )));
        messages.push(Message::assistant(format!(
            "Fact {i}: the sea is deep, wide, salty and full of life."
        )));
    }
    messages.push(Message::user(
        "What is the capital of France? Answer in one word.",
    ));
    let full = h
        .tokenize_prompt(&Prompt::Messages(messages.clone()))
        .unwrap()
        .len();
    assert!(full > 160);

    let req = GenerateRequest {
        params: SamplingParams::greedy(),
        max_tokens: Some(16),
        ..GenerateRequest::chat(messages.clone())
    };
    let mut gen = h.generate(req.clone()).unwrap();
    let (prompt_tokens, dropped) = gen
        .find_map(|e| {
            if let Event::Started {
                prompt_tokens,
                dropped_messages,
                ..
            } = e
            {
                Some((prompt_tokens, dropped_messages))
            } else {
                None
            }
        })
        .unwrap();
    assert!(
        dropped >= 2 && dropped % 2 == 0,
        "whole turns dropped: {dropped}"
    );
    assert!(prompt_tokens + 16 <= 160);
    let rest = gen.collect_blocking().unwrap();
    assert!(rest.text.contains("Paris"), "{}", rest.text);

    let stop = GenerateRequest {
        overflow: Overflow::Stop,
        ..req
    };
    assert!(matches!(
        h.generate(stop),
        Err(Error::PromptTooLong { context: 160, .. })
    ));
}

/// Issue 40: fitting a long history drops the fewest whole turns that make it fit, and costs a
/// few renders, not one per dropped turn (2,000 turns once took a render and a tokenisation of
/// the whole conversation for each of the ~1,990 it dropped: a request that stalled a server).
#[test]
fn a_long_history_is_fitted_by_dropping_the_fewest_turns_at_once() {
    let e = engine(|c| EngineConfig {
        context_size: Some(512),
        ..c
    });
    let h: Handle = e.handle();
    let mut messages = vec![Message::system("You are brief.")];
    for i in 0..2_000 {
        messages.push(Message::user(format!("Fact {i} about the sea, please.")));
        messages.push(Message::assistant(format!("Fact {i}: it is salty.")));
    }
    messages.push(Message::user("What is the capital of France?"));
    let started = std::time::Instant::now();
    let mut gen = h
        .generate(GenerateRequest {
            params: SamplingParams::greedy(),
            max_tokens: Some(8),
            ..GenerateRequest::chat(messages.clone())
        })
        .unwrap();
    let (prompt_tokens, dropped) = gen
        .find_map(|e| match e {
            Event::Started {
                prompt_tokens,
                dropped_messages,
                ..
            } => Some((prompt_tokens, dropped_messages)),
            _ => None,
        })
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "fitting took {:?}",
        started.elapsed()
    );
    assert!(
        dropped % 2 == 0 && prompt_tokens + 8 <= 512,
        "{dropped} {prompt_tokens}"
    );
    // The fewest: one turn fewer dropped does not fit.
    let mut kept = vec![messages[0].clone()];
    kept.extend(messages[1 + dropped - 2..].iter().cloned());
    let one_more = h.tokenize_prompt(&Prompt::Messages(kept)).unwrap().len();
    assert!(one_more + 8 > 512, "{one_more} tokens would have fitted");
    drop(gen);
}

/// Issue 13: an answer preempted for memory and admitted again, while an identical greedy
/// answer finished in the meantime, finds a kept cache covering more than its prompt. It is
/// taken up where it was (the prompt reuse it reports stays the prompt's), and it ends whole:
/// the same tokens as the answer that finished first. (This underflowed and killed the
/// inference thread.)
#[test]
fn an_answer_readmitted_over_an_identical_finished_one_ends_whole() {
    let e = engine(|c| EngineConfig {
        kv_budget: Some(700 * KV_PER_TOKEN),
        ..c
    });
    let h = e.handle();
    let first = h.generate(greedy(LONG, 300)).unwrap();
    let mut second = h.generate(greedy(LONG, 300)).unwrap();
    let first = first.collect_blocking().unwrap();
    let (mut started, mut requeued, mut ids, mut end) = (None, false, Vec::new(), None);
    while let Some(ev) = second.blocking_next() {
        match ev {
            Event::Started {
                prompt_tokens,
                reused_tokens,
                ..
            } => started = Some((prompt_tokens, reused_tokens)),
            Event::Queued { .. } if started.is_some() => requeued = true,
            Event::Token { id, .. } => ids.push(id),
            Event::Stats { reused_tokens, .. } => {
                let (prompt, _) = started.unwrap();
                assert!(
                    reused_tokens < prompt,
                    "reports {reused_tokens} reused of a {prompt}-token prompt"
                );
            }
            Event::Done { reason, usage, .. } => end = Some((reason, usage)),
            Event::Error { message } => panic!("the second answer failed: {message}"),
            Event::Queued { .. } => {}
        }
    }
    assert!(
        requeued,
        "the second answer was preempted back into the queue"
    );
    let (reason, usage) = end.expect("the second answer ended with Done");
    assert_eq!((reason, usage.completion_tokens), (StopReason::Length, 300));
    assert_eq!(ids, first.ids);
    // The engine lives on.
    let after = h
        .generate(greedy(SHORT, 8))
        .unwrap()
        .collect_blocking()
        .unwrap();
    assert!(after.text.contains("Paris"), "{}", after.text);
}

/// Answers that outgrow the KV budget while streaming: the newest gives its cache up, waits,
/// and is recomputed; both finish whole, and memory stays within the budget plus one answer.
#[test]
fn answers_that_outgrow_the_budget_are_preempted_and_recomputed_not_aborted() {
    let budget = 700 * KV_PER_TOKEN;
    let e = engine(|c| EngineConfig {
        kv_budget: Some(budget),
        ..c
    });
    let h = e.handle();
    let first = h.generate(greedy(LONG, 300)).unwrap();
    let mut second = h.generate(greedy(SHORT, 300)).unwrap();
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let watch = {
        let (h, peak) = (h.clone(), peak.clone());
        std::thread::spawn(move || {
            for _ in 0..6000 {
                peak.fetch_max(h.cache_bytes(), std::sync::atomic::Ordering::Relaxed);
                if h.live_ids().is_empty() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let first = first.collect_blocking().unwrap();
    let (mut started, mut requeued, mut tokens, mut reason) = (false, false, 0, None);
    while let Some(ev) = second.blocking_next() {
        match ev {
            Event::Started { .. } => started = true,
            Event::Queued { .. } if started => requeued = true,
            Event::Token { .. } => tokens += 1,
            Event::Done { reason: r, .. } => reason = Some(r),
            _ => {}
        }
    }
    watch.join().unwrap();
    assert!(
        requeued,
        "the newer answer was preempted back into the queue"
    );
    assert_eq!(
        (first.usage.completion_tokens, first.reason),
        (300, Some(StopReason::Length))
    );
    assert_eq!((tokens, reason), (300, Some(StopReason::Length)));
    let one_answer = 512 * KV_PER_TOKEN;
    assert!(peak.load(std::sync::atomic::Ordering::Relaxed) <= budget + one_answer);
}
