//! # rill-chat
//!
//! The one place where the engine and the store meet: answering a stored conversation, with
//! every token persisted as it streams. The desktop app, the API server and the `rill` CLI
//! all call [`answer`] (or [`continue_answer`] for an interrupted one), so a generation is
//! started, streamed and saved the same way everywhere.

use rill_engine::{
    Control, Event, GenerateRequest, Generation, Handle, Message, Prompt, Role, SamplingParams,
    StopReason, Timings, Usage,
};
use rill_store::{MessageStats, Status, Store};

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

/// An ended answer's token counts and speed, as the store keeps them.
pub fn stats_of(usage: Usage, timings: Timings) -> MessageStats {
    MessageStats {
        prompt_tokens: Some(usage.prompt_tokens as i64),
        completion_tokens: Some(usage.completion_tokens as i64),
        ttft_ms: Some(timings.ttft_ms),
        decode_tps: Some(timings.decode_tps),
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
            };
            Message::new(role, m.content.clone())
        }))
        .collect()
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
    Ok(history(conv.system_prompt.as_deref(), &path))
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
    let before = history(conv.system_prompt.as_deref(), &path[..path.len() - 1]);
    // The template opens the assistant's turn; the partial answer follows it verbatim.
    let prompt = handle.render(&before)? + &partial.content;
    let writer = store.resume_answer(message).await?;
    // It keeps the probabilities of the part it already has.
    let kept = match options.top_candidates {
        0 => Vec::new(),
        _ => match store.message_tokens(message).await? {
            Some(v) => serde_json::from_value(v).unwrap_or_default(),
            None => Vec::new(),
        },
    };
    start(handle, store, writer, Prompt::Text(prompt), options, kept).await
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
}

async fn start(
    handle: &Handle,
    store: &Store,
    writer: rill_store::StreamWriter,
    prompt: Prompt,
    options: AnswerOptions,
    kept: Vec<TokenProbs>,
) -> Result<Answering> {
    let request = GenerateRequest {
        params: options.params,
        stop: options.stop,
        max_tokens: options.max_tokens,
        top_candidates: options.top_candidates,
        ..GenerateRequest::new(prompt)
    };
    start_request(handle, store, writer, request, kept).await
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
    start_request(handle, store, writer, request, Vec::new()).await
}

async fn start_request(
    handle: &Handle,
    store: &Store,
    writer: rill_store::StreamWriter,
    request: GenerateRequest,
    kept: Vec<TokenProbs>,
) -> Result<Answering> {
    let keep_probs = request.top_candidates > 0;
    match handle.generate(request) {
        Ok(generation) => Ok(Answering {
            generation,
            message_id: writer.message_id(),
            writer: Some(writer),
            handle: handle.clone(),
            probs: keep_probs.then(|| (store.clone(), kept)),
            answer: None,
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
            Event::Token { text, .. } => {
                writer.push(text);
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
                let message = w
                    .finish(status_of(*reason), stats_of(*usage, *timings), None)
                    .await?;
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
