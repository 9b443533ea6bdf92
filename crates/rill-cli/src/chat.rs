//! `rill chat`: a conversation in the terminal, one user turn per line of stdin, every turn
//! saved in the store as it streams (`--continue ID` resumes one, first finishing an answer a
//! crash or a stop cut short). A thinking model's reasoning prints inside its block.

use std::io::{BufRead, IsTerminal, Write};

use anyhow::{Context, Result};
use clap::Args;
use rill_engine::Event;

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    model: crate::ModelArgs,
    #[command(flatten)]
    sampling: crate::SamplingArgs,
    #[command(flatten)]
    think: crate::output::ThinkArgs,
    /// Speculative decoding by prompt lookup (see `run --lookup`).
    #[arg(long)]
    lookup: bool,
    /// System prompt (for a new conversation).
    #[arg(long)]
    system: Option<String>,
    #[command(flatten)]
    db: crate::DbArgs,
    /// Continue conversation ID (an interrupted answer is finished first).
    #[arg(long = "continue", value_name = "ID")]
    continue_id: Option<i64>,
}

pub fn chat(a: ChatArgs) -> Result<()> {
    a.sampling.params().validate()?;
    let rt = crate::runtime()?;
    let store = rt.block_on(a.db.open())?;
    let speculation = a.model.speculation(a.lookup)?;
    let engine = a.model.start()?;
    let handle = engine.handle();
    let options = || rill_chat::AnswerOptions {
        params: a.sampling.params(),
        stop: a.sampling.stop.clone(),
        max_tokens: a.sampling.max_tokens,
        top_candidates: 0,
        chat: a.think.chat(),
        thinking_budget: a.think.budget(),
        grammar: None,
        speculation,
    };
    // Prints an answer's tokens as they come (its reasoning in its block), and a newline at
    // its end.
    let mut printer = crate::output::Printer::new(false);
    let mut print_tokens = |event: &Event| {
        let _ = printer.print(&mut std::io::stdout().lock(), event);
    };
    let conversation = match a.continue_id {
        Some(id) => {
            let conv = rt.block_on(store.conversation(id))?;
            let path = rt.block_on(store.current_path(id))?;
            for m in &path {
                println!("{}: {}", role_name(m.role), m.content);
            }
            // Finish an answer that a crash or a stop cut short.
            if let Some(last) = path.last().filter(|m| {
                m.role == rill_store::Role::Assistant
                    && matches!(
                        m.status,
                        rill_store::Status::Interrupted | rill_store::Status::Stopped
                    )
            }) {
                print!("{}", last.content);
                rt.block_on(rill_chat::continue_answer(
                    &handle,
                    &store,
                    last.id,
                    options(),
                    &mut print_tokens,
                ))?;
            }
            conv.id
        }
        None => {
            let new = rill_store::NewConversation {
                model: Some(handle.model_info().name.clone()),
                system_prompt: a.system.clone(),
                settings: Some(a.sampling.params().to_json()),
            };
            rt.block_on(store.create_conversation(new))?.id
        }
    };
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!(
            "Chatting with {} — conversation {conversation} in {}. Empty line or Ctrl-D to quit.",
            handle.model_info().name,
            store.path().display()
        );
    } else {
        eprintln!("conversation {conversation}");
    }
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        if interactive {
            eprint!("> ");
            std::io::stderr().flush()?;
        }
        let Some(line) = lines.next() else { break };
        let line = line.context("reading stdin")?;
        let line = line.trim();
        if line.is_empty() {
            if interactive {
                break;
            }
            continue;
        }
        rt.block_on(store.append(conversation, rill_store::NewMessage::user(line)))?;
        rt.block_on(rill_chat::answer(
            &handle,
            &store,
            conversation,
            options(),
            &mut print_tokens,
        ))?;
    }
    Ok(())
}

pub fn role_name(role: rill_store::Role) -> &'static str {
    match role {
        rill_store::Role::System => "system",
        rill_store::Role::User => "user",
        rill_store::Role::Assistant => "assistant",
        rill_store::Role::Tool => "tool",
    }
}
