//! # rill-chat
//!
//! The one place where the engine and the store meet: answering a stored conversation, with
//! every token persisted as it streams. The desktop app, the API server and the `rill` CLI
//! all call [`answer`] (or [`continue_answer`] for an interrupted one), so a generation is
//! started, streamed and saved the same way everywhere.

use rill_engine::{
    ChatArgs, Control, Event, GenerateRequest, Generation, Grammar, Handle, Message, Prompt, Role,
    SamplingParams, Speculation, StopReason, Timings, ToolCall, Usage,
};
use rill_store::{MessageStats, Status, Store};

mod thinking;
mod tools;

use thinking::{continued, Thinking};
pub use tools::{calls_json, calls_of};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Engine(#[from] rill_engine::Error),
    #[error(transparent)]
    Store(#[from] rill_store::Error),
    #[error("{0}")]
    Generation(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How to answer (the sampling panel's values and limits).
#[derive(Clone, Debug, Default)]
pub struct AnswerOptions {
    pub params: SamplingParams,
    pub stop: Vec<String>,
    pub max_tokens: Option<usize>,
    /// Keep each token's likeliest candidates (this many; 0: none) with the answer.
    pub top_candidates: usize,
    /// Variables for the chat template (the panel's Think switch is `enable_thinking`).
    pub chat: ChatArgs,
    /// Close a thinking model's block after this many tokens of it.
    pub thinking_budget: Option<usize>,
    /// What every answer must match (the panel's structured output: a JSON schema).
    pub grammar: Option<Grammar>,
    /// Speculative decoding: how the answer's next tokens are proposed to check several at
    /// a time.
    pub speculation: Speculation,
}

/// One answer token as kept with its message: the text it added and the candidates it was
/// drawn from (see [`Store::message_tokens`]).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TokenProbs {
    pub id: u32,
    pub text: String,
    pub candidates: Vec<CandidateText>,
}

/// A candidate token with its text: raw probability and probability after sampling.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CandidateText {
    pub id: u32,
    pub text: String,
    pub raw: f32,
    pub sampled: f32,
}

impl TokenProbs {
    /// The record of a `Token` event that carries candidates; `None` for one that does not.
    pub fn of(handle: &Handle, event: &Event) -> Option<TokenProbs> {
        let Event::Token {
            id,
            text,
            candidates,
            ..
        } = event
        else {
            return None;
        };
        if candidates.is_empty() {
            return None;
        }
        Some(TokenProbs {
            id: *id,
            text: text.clone(),
            candidates: candidates
                .iter()
                .map(|c| CandidateText {
                    id: c.id,
                    text: token_text(handle, c.id),
                    raw: c.raw,
                    sampled: c.sampled,
                })
                .collect(),
        })
    }
}

/// A token's own text, for showing it alone (a token that is half a character shows U+FFFD).
pub fn token_text(handle: &Handle, id: u32) -> String {
    String::from_utf8_lossy(handle.tokenizer().piece_bytes(id)).into_owned()
}

/// A saved answer and why it ended.
#[derive(Clone, Debug)]
pub struct Answer {
    pub message: rill_store::Message,
    pub reason: StopReason,
}

/// How an ended answer is kept: `stopped` when it was cancelled, else `done`.
pub fn status_of(reason: StopReason) -> Status {
    if reason == StopReason::Cancelled {
        Status::Stopped
    } else {
        Status::Done
    }
}

/// An ended answer's token counts and speed, as the store keeps them; `reasoning_ms` is how
/// long it thought, for an answer that did.
pub fn stats_of(usage: Usage, timings: Timings, reasoning_ms: Option<f64>) -> MessageStats {
    let thought = usage.reasoning_tokens > 0 || reasoning_ms.is_some();
    MessageStats {
        prompt_tokens: Some(usage.prompt_tokens as i64),
        completion_tokens: Some(usage.completion_tokens as i64),
        ttft_ms: Some(timings.ttft_ms),
        decode_tps: Some(timings.decode_tps),
        reasoning_tokens: thought.then_some(usage.reasoning_tokens as i64),
        reasoning_ms: thought.then(|| reasoning_ms.unwrap_or(0.0)),
        draft_proposed: (usage.draft_proposed > 0).then_some(usage.draft_proposed as i64),
        draft_accepted: (usage.draft_proposed > 0).then_some(usage.draft_accepted as i64),
    }
}

/// The engine's view of a stored branch: the conversation's system prompt, then its messages.
pub fn history(system_prompt: Option<&str>, path: &[rill_store::Message]) -> Vec<Message> {
    let system = system_prompt
        .filter(|s| !s.trim().is_empty())
        .map(Message::system);
    system
        .into_iter()
        .chain(path.iter().map(|m| {
            let role = match m.role {
                rill_store::Role::System => Role::System,
                rill_store::Role::User => Role::User,
                rill_store::Role::Assistant => Role::Assistant,
                rill_store::Role::Tool => Role::Tool,
            };
            let mut message = Message::new(role, m.content.clone());
            // The template decides whether the model reads its past reasoning again.
            message.reasoning = (!m.reasoning.is_empty()).then(|| m.reasoning.clone());
            message.tool_calls = m.tool_calls.as_ref().map(calls_of).unwrap_or_default();
            message.tool_call_id = m.tool_call_id.clone();
            message
        }))
        .collect()
}

/// [`history`] with each message's images read from the store (issue 42).
pub async fn history_with_images(
    store: &Store,
    system_prompt: Option<&str>,
    path: &[rill_store::Message],
) -> Result<Vec<Message>> {
    let mut messages = history(system_prompt, path);
    // The system prompt, when there is one, comes first.
    let skip = messages.len() - path.len();
    for (message, stored) in messages[skip..].iter_mut().zip(path) {
        for hash in &stored.images {
            let image = store.image(hash).await?;
            message
                .images
                .push(rill_engine::ImageData::new(image.bytes));
        }
    }
    Ok(messages)
}

/// Answers the conversation's current branch: a new assistant message under its leaf, written
/// as it streams. `on_event` sees every event (to print or forward tokens).
pub async fn answer(
    handle: &Handle,
    store: &Store,
    conversation: i64,
    options: AnswerOptions,
    on_event: impl FnMut(&Event),
) -> Result<Answer> {
    let leaf = store.conversation(conversation).await?.current_leaf_id;
    begin(handle, store, conversation, leaf, options)
        .await?
        .finish(on_event)
        .await
}

/// Continues an `interrupted` (or `stopped`) answer in place: the model picks up after the
/// text it already has.
pub async fn continue_answer(
    handle: &Handle,
    store: &Store,
    message: i64,
    options: AnswerOptions,
    on_event: impl FnMut(&Event),
) -> Result<Answer> {
    begin_continue(handle, store, message, options)
        .await?
        .finish(on_event)
        .await
}

/// Starts an answer under `parent` (the conversation's leaf for a new answer, the question
/// for a regenerate, which makes a sibling branch). The answer's message exists, with status
/// `streaming`, when this returns; [`Answering::finish`] streams and saves the rest.
pub async fn begin(
    handle: &Handle,
    store: &Store,
    conversation: i64,
    parent: Option<i64>,
    options: AnswerOptions,
) -> Result<Answering> {
    let messages = prompt_under(store, conversation, parent).await?;
    let settings = Some(options.params.to_json());
    let writer = store
        .begin_answer(
            conversation,
            parent,
            Some(handle.model_info().name.clone()),
            settings,
        )
        .await?;
    start(
        handle,
        store,
        writer,
        Prompt::Messages(messages),
        options,
        Vec::new(),
    )
    .await
}

/// What the model is asked for an answer under `parent`: the conversation's system prompt and
/// the branch from its root to `parent` (nothing for a first message's answer).
pub async fn prompt_under(
    store: &Store,
    conversation: i64,
    parent: Option<i64>,
) -> Result<Vec<Message>> {
    let conv = store.conversation(conversation).await?;
    let path = match parent {
        Some(p) => store.path_to(p).await?,
        None => Vec::new(),
    };
    history_with_images(store, conv.system_prompt.as_deref(), &path).await
}

/// Starts continuing a stopped or interrupted answer (see [`continue_answer`]).
pub async fn begin_continue(
    handle: &Handle,
    store: &Store,
    message: i64,
    options: AnswerOptions,
) -> Result<Answering> {
    let partial = store.message(message).await?;
    let conv = store.conversation(partial.conversation_id).await?;
    let path = store.path_to(message).await?;
    let before = &path[..path.len() - 1];
    // The template opens the assistant's turn; the partial answer follows it verbatim, its
    // thinking block written back around its reasoning. Pictures in the conversation stand
    // as markers in the text, and go with it.
    let pictured = before.iter().any(|m| !m.images.is_empty());
    let before = match pictured {
        true => history_with_images(store, conv.system_prompt.as_deref(), before).await?,
        false => history(conv.system_prompt.as_deref(), before),
    };
    let opened = match pictured {
        true => handle.render_chat_marked(&before, &options.chat)?,
        false => handle.render_chat(&before, &options.chat)?,
    };
    let (text, inside) = continued(&opened, &partial.reasoning, &partial.content);
    let prompt = match pictured {
        true => Prompt::Pictured {
            text,
            images: before.into_iter().flat_map(|m| m.images).collect(),
        },
        false => Prompt::Text(text),
    };
    let writer = store.resume_answer(message).await?;
    // It keeps the probabilities of the part it already has.
    let kept = match options.top_candidates {
        0 => Vec::new(),
        _ => match store.message_tokens(message).await? {
            Some(v) => serde_json::from_value(v).unwrap_or_default(),
            None => Vec::new(),
        },
    };
    // The budget counts the reasoning the answer already has (an interrupted answer has no
    // count saved: its text's tokens).
    let thought = match partial.stats.reasoning_tokens {
        Some(n) => n.max(0) as usize,
        None if partial.reasoning.is_empty() => 0,
        None => handle
            .tokenizer()
            .encode_with(&partial.reasoning, false)?
            .len(),
    };
    let request = GenerateRequest {
        continues_reasoning: Some(inside),
        thinking_budget: options
            .thinking_budget
            .map(|b| b.saturating_sub(thought).max(1)),
        ..request_of(prompt, options)
    };
    let thinking = Thinking::continuing(partial.stats.reasoning_ms, thought);
    start_request(handle, store, writer, request, kept, thinking).await
}

/// An answer on its way: the stored message it grows into, the controls of its generation
/// (stop, pause, resume, live settings, priority), and the events, each saved before it is
/// handed on ([`next_event`](Self::next_event), or [`finish`](Self::finish) to run it out).
pub struct Answering {
    generation: Generation,
    /// `None` once the answer is saved for good.
    writer: Option<rill_store::StreamWriter>,
    message_id: i64,
    handle: Handle,
    /// Set when the answer keeps its token probabilities: where, and those it has so far.
    probs: Option<(Store, Vec<TokenProbs>)>,
    /// The saved answer, once `Done` came.
    answer: Option<Answer>,
    thinking: Thinking,
    store: Store,
}

async fn start(
    handle: &Handle,
    store: &Store,
    writer: rill_store::StreamWriter,
    prompt: Prompt,
    options: AnswerOptions,
    kept: Vec<TokenProbs>,
) -> Result<Answering> {
    let request = request_of(prompt, options);
    start_request(handle, store, writer, request, kept, Thinking::default()).await
}

/// The engine's request for an answer with `options`. A thinking model's reasoning comes apart
/// from its content, as the store keeps them.
fn request_of(prompt: Prompt, options: AnswerOptions) -> GenerateRequest {
    GenerateRequest {
        params: options.params,
        stop: options.stop,
        max_tokens: options.max_tokens,
        top_candidates: options.top_candidates,
        split_reasoning: true,
        thinking_budget: options.thinking_budget,
        chat: options.chat,
        grammar: options.grammar,
        speculation: options.speculation,
        ..GenerateRequest::new(prompt)
    }
}

/// Starts `request` as the answer under `parent`, saved as it streams, for a caller whose
/// request was built elsewhere (the API: its stop strings, logprobs and limits) and whose
/// conversation is already stored up to `parent`.
pub async fn begin_request(
    handle: &Handle,
    store: &Store,
    conversation: i64,
    parent: Option<i64>,
    request: GenerateRequest,
) -> Result<Answering> {
    let writer = store
        .begin_answer(
            conversation,
            parent,
            Some(handle.model_info().name.clone()),
            Some(request.params.to_json()),
        )
        .await?;
    start_request(
        handle,
        store,
        writer,
        request,
        Vec::new(),
        Thinking::default(),
    )
    .await
}

async fn start_request(
    handle: &Handle,
    store: &Store,
    writer: rill_store::StreamWriter,
    request: GenerateRequest,
    kept: Vec<TokenProbs>,
    thinking: Thinking,
) -> Result<Answering> {
    let keep_probs = request.top_candidates > 0;
    // Rendering the template, tokenising and compiling a grammar take time on a long
    // conversation: off the async threads, which serve every other chat and request.
    let engine = handle.clone();
    let started = match tokio::task::spawn_blocking(move || engine.generate(request)).await {
        Ok(started) => started,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(rill_engine::Error::EngineStopped),
    };
    match started {
        Ok(generation) => Ok(Answering {
            generation,
            message_id: writer.message_id(),
            writer: Some(writer),
            handle: handle.clone(),
            probs: keep_probs.then(|| (store.clone(), kept)),
            answer: None,
            thinking,
            store: store.clone(),
        }),
        Err(e) => {
            writer
                .finish(Status::Error, MessageStats::default(), Some(e.to_string()))
                .await?;
            Err(e.into())
        }
    }
}

impl Answering {
    /// The stored message's id.
    pub fn message_id(&self) -> i64 {
        self.message_id
    }

    /// Steers the generation while it runs.
    pub fn control(&self) -> Control {
        self.generation.control().clone()
    }

    /// How many tokens the prompt has.
    pub fn prompt_tokens(&self) -> usize {
        self.generation.prompt_tokens()
    }

    /// Keeps the tool calls read from the ended answer's text as its calls, and `content`,
    /// the text besides them, as its text.
    pub async fn save_calls(&self, content: &str, calls: &[ToolCall]) -> Result<()> {
        Ok(self
            .store
            .set_tool_calls(self.message_id, content, &calls_json(calls))
            .await?)
    }

    /// The saved answer, once [`next_event`](Self::next_event) has returned `Done`.
    pub fn answer(&self) -> Option<&Answer> {
        self.answer.as_ref()
    }

    /// The next event, once what it says is saved: a token's text goes to the writer; `Done`
    /// saves the answer (`done`, or `stopped` when cancelled) and `Error` saves it as `error`
    /// with the message, before either is returned. With each token, its probabilities when
    /// the answer keeps them. `Ok(None)` after the last event.
    pub async fn next_event(&mut self) -> Result<Option<(Event, Option<TokenProbs>)>> {
        let Some(writer) = self.writer.as_ref() else {
            return Ok(None);
        };
        let Some(event) = self.generation.next_event().await else {
            if let Some(w) = self.writer.take() {
                w.finish(
                    Status::Error,
                    MessageStats::default(),
                    Some("the engine stopped".into()),
                )
                .await?;
            }
            return Err(Error::Generation(
                "the engine stopped before the answer ended".into(),
            ));
        };
        let token_probs = match self.probs {
            Some(_) => TokenProbs::of(&self.handle, &event),
            None => None,
        };
        match &event {
            Event::Token {
                text, reasoning, ..
            } => {
                writer.push_reasoning(reasoning);
                writer.push(text);
                self.thinking.see(reasoning, text);
                if let (Some((_, kept)), Some(p)) = (self.probs.as_mut(), &token_probs) {
                    kept.push(p.clone());
                }
            }
            Event::Done {
                reason,
                usage,
                timings,
            } => {
                let w = self.writer.take().expect("checked above");
                self.thinking.end();
                let usage = Usage {
                    reasoning_tokens: usage.reasoning_tokens + self.thinking.before_tokens,
                    ..*usage
                };
                let stats = stats_of(usage, *timings, self.thinking.ms);
                let message = w.finish(status_of(*reason), stats, None).await?;
                self.save_probs().await?;
                self.answer = Some(Answer {
                    message,
                    reason: *reason,
                });
            }
            Event::Error { message } => {
                let w = self.writer.take().expect("checked above");
                w.finish(
                    Status::Error,
                    MessageStats::default(),
                    Some(message.clone()),
                )
                .await?;
                self.save_probs().await?;
            }
            Event::Queued { .. } | Event::Started { .. } | Event::Stats { .. } => {}
        }
        Ok(Some((event, token_probs)))
    }

    async fn save_probs(&mut self) -> Result<()> {
        if let Some((store, tokens)) = &self.probs {
            if !tokens.is_empty() {
                let json = serde_json::to_value(tokens).unwrap_or_default();
                store.set_message_tokens(self.message_id, &json).await?;
            }
        }
        Ok(())
    }

    /// Streams the answer to its end, saving it as it grows, and returns the saved message.
    /// `on_event` sees every event. A stopped answer is kept with status `stopped`.
    pub async fn finish(self, mut on_event: impl FnMut(&Event)) -> Result<Answer> {
        self.finish_with_probs(|e, _| on_event(e)).await
    }

    /// [`finish`](Self::finish), with each token's probabilities (when the answer keeps them)
    /// beside its event, so a caller that shows them need not build them again.
    pub async fn finish_with_probs(
        mut self,
        mut on_event: impl FnMut(&Event, Option<&TokenProbs>),
    ) -> Result<Answer> {
        let mut failure = None;
        while let Some((event, probs)) = self.next_event().await? {
            on_event(&event, probs.as_ref());
            if let Event::Error { message } = event {
                failure = Some(message);
            }
        }
        match (self.answer, failure) {
            (Some(answer), _) => Ok(answer),
            (None, Some(message)) => Err(Error::Generation(message)),
            (None, None) => Err(Error::Generation("the answer ended without a word".into())),
        }
    }

    /// Stops the answer and saves what it has as `stopped`, in the background: for a caller
    /// that goes away mid-answer (an API client hanging up).
    pub fn stop_in_background(self) {
        if self.writer.is_none() || tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let _ = self.generation.cancel();
        tokio::spawn(async move {
            if let Err(e) = self.finish(|_| {}).await {
                tracing::warn!(error = %e, "could not save the stopped answer");
            }
        });
    }
}
