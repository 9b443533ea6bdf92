//! The [`Handle`]: a cheap, cloneable way to talk to the engine from any thread or task. Every
//! check that depends on a request runs here, on the caller's thread (parameters, the grammar,
//! the chat template, tokenising, fitting the context), so the caller gets the error at once
//! and the inference thread only ever sees valid work (`command.rs`).

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::Instant;

use serde_json::Value;
use tokio::sync::mpsc::unbounded_channel;
use tokio::sync::oneshot;

use crate::command::{Command, PreviewJob, Shared};
use crate::constraint::Grammar;
use crate::draft::{DraftInfo, DraftModel};
use crate::error::{Error, Result};
use crate::event::Activity;
use crate::generation::{Control, Generation};
use crate::message::ImageData;
use crate::model::ModelInfo;
use crate::prompting::Prompter;
use crate::reasoning::ReasoningSplit;
use crate::request::{
    ChatArgs, GenerateRequest, Overflow, PreviewRequest, Prompt, Speculation, MAX_CANDIDATES,
    MAX_PRIORITY,
};
use crate::sampler::{Distribution, Sampler};
use crate::sequence::{Sequence, SequenceSpec};
use crate::stop::StopStrings;
use crate::template::Message;
use crate::tokenizer::{StreamDecoder, Tokenizer};
use crate::tools::ToolFormat;
use crate::vision::PromptImage;

/// A cheap, cloneable way to talk to the engine from any thread or task.
#[derive(Clone)]
pub struct Handle {
    pub(crate) tx: mpsc::Sender<Command>,
    pub(crate) shared: Arc<Shared>,
}

impl Handle {
    pub(crate) fn send(&self, cmd: Command) -> Result<()> {
        self.tx.send(cmd).map_err(|_| Error::EngineStopped)
    }

    pub fn model_info(&self) -> &ModelInfo {
        &self.shared.info
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.shared.tokenizer
    }

    /// Positions one sequence may hold.
    pub fn context_length(&self) -> usize {
        self.shared.context_length
    }

    /// Bytes of weights one decode step reads, as the engine holds them and as the file
    /// stores them (they differ where a format is repacked): with the machine's read
    /// bandwidth, the bound on decode speed.
    pub fn step_weight_bytes(&self) -> (usize, usize) {
        self.shared.step_weight_bytes
    }

    /// Multiply-adds a prompt row takes in the layers' matrices: with the machine's rate of
    /// byte products ([`crate::kernels::byte_product_peak`]), the bound on prefill speed.
    pub fn prompt_row_macs(&self) -> usize {
        self.shared.prompt_row_macs
    }

    /// Whether every weight matrix runs in its fastest layout: a model loads with some read
    /// in the file's map, and the engine makes their panels when idle or at the first long
    /// prompt (`kernels/later.rs`); prompts run at full speed from then on.
    pub fn weights_ready(&self) -> bool {
        !self.shared.panels_pending.load(Ordering::Relaxed)
    }

    /// Bytes of weights locked in memory ([`EngineConfig::lock_weights`]): 0 when not asked
    /// for, fewer than the weights when the system refused part of them.
    pub fn locked_weight_bytes(&self) -> usize {
        self.shared.locked_weight_bytes
    }

    /// Threads of the engine's compute pool.
    pub fn threads(&self) -> usize {
        self.shared.threads
    }

    /// Bytes of KV cache held by live sequences, as of the last round.
    pub fn cache_bytes(&self) -> usize {
        self.shared.cache_bytes.load(Ordering::Relaxed)
    }

    /// Bytes of KV cache kept from finished answers for prefix reuse.
    pub fn prefix_cache_bytes(&self) -> usize {
        self.shared.prefix_bytes.load(Ordering::Relaxed)
    }

    /// Ids of the generations the thread holds, as of the last round.
    pub fn live_ids(&self) -> Vec<u64> {
        self.activity().into_iter().map(|a| a.id).collect()
    }

    /// What every live generation is doing, as of the last round.
    pub fn activity(&self) -> Vec<Activity> {
        self.shared
            .live
            .lock()
            .map(|l| l.clone())
            .unwrap_or_default()
    }

    /// Checks that `grammar` can constrain an answer (a JSON schema llguidance accepts, a Lark
    /// grammar that parses), without starting anything. The first call builds the token trie.
    /// What it compiled is kept for the next answer with the same grammar, so a check before
    /// [`generate`](Self::generate) does not compile a large schema twice.
    pub fn check_grammar(&self, grammar: &Grammar) -> Result<()> {
        self.shared.grammars.check(grammar)
    }

    /// Starts a generation. Every check that depends on the request happens here.
    pub fn generate(&self, req: GenerateRequest) -> Result<Generation> {
        let sampler = Sampler::new(req.params.clone())?;
        let prompter = self.prompter();
        if req.max_tokens == Some(0) {
            return Err(Error::param("max_tokens", "must be ≥ 1"));
        }
        if req.thinking_budget == Some(0) {
            return Err(Error::param("thinking_budget", "must be ≥ 1"));
        }
        if req.speculation == Speculation::Draft && self.draft_model().is_none() {
            return Err(Error::param(
                "speculation",
                "no draft model is loaded (start with --draft-model FILE, or choose one)",
            ));
        }
        let constraint = match &req.grammar {
            Some(g) => Some(self.shared.grammars.compile(g)?),
            None => None,
        };
        let (mut prompt, dropped_messages) =
            prompter.fit(&req.prompt, &req.chat, req.max_tokens, req.overflow)?;
        let images = self.prompt_images(&req.prompt, &prompt)?;
        // A draft model reads tokens only: an answer about an image does not speculate with
        // one (lookup drafts skip image rows).
        let speculation = match req.speculation {
            Speculation::Draft if !images.is_empty() => Speculation::Off,
            s => s,
        };
        // gpt-oss's harmony messages are split by their channels; with tools offered, the
        // tool reader reads them instead (it knows the calls too).
        let harmony = self.tool_format() == ToolFormat::Harmony && req.chat.tools.is_empty();
        let split = match (req.split_reasoning, req.continues_reasoning) {
            (false, _) => None,
            (true, Some(inside)) if harmony => Some(ReasoningSplit::harmony_resumed(inside)),
            (true, Some(inside)) => Some(ReasoningSplit::resumed(inside)),
            // Under a grammar or a thinking budget the engine writes the analysis header
            // itself (what gpt-oss writes first): the budget then counts from the first
            // token, and the grammar waits for the final message.
            (true, None) if harmony => Some(
                match (req.grammar.is_some() || req.thinking_budget.is_some())
                    && prompter.open_analysis(&req, &mut prompt)
                {
                    true => ReasoningSplit::harmony_resumed(true),
                    false => ReasoningSplit::harmony(),
                },
            ),
            (true, None) => {
                let opened =
                    prompter.opens_thinking(&prompt) || prompter.open_thinking(&req, &mut prompt);
                Some(ReasoningSplit::new(opened))
            }
        };
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let (events_tx, events) = unbounded_channel();
        let prompt_tokens = prompt.len();
        // A new answer after a chat template drops the space a SentencePiece vocabulary puts
        // before its first word; raw text and tokens are continued as they are (issue 14).
        let mut decoder = match req.prompt {
            Prompt::Messages(_) => StreamDecoder::new(&self.shared.tokenizer),
            Prompt::Text(_) | Prompt::Pictured { .. } | Prompt::Tokens(_) => {
                StreamDecoder::continuing()
            }
        };
        // The markers a reader parses are shown as text (control tokens are not, otherwise).
        if !req.chat.tools.is_empty() || (harmony && split.is_some()) {
            decoder.show(prompter.marker_ids(self.tool_format()));
        }
        let seq = Sequence::new(SequenceSpec {
            id,
            prompt,
            sampler,
            stops: StopStrings::new(req.stop),
            decoder,
            max_tokens: req.max_tokens,
            context_length: self.shared.context_length,
            ignore_eos: req.ignore_eos,
            priority: req.priority.clamp(1, MAX_PRIORITY),
            dropped_messages,
            top_candidates: req.top_candidates.min(MAX_CANDIDATES),
            constraint,
            split,
            thinking_budget: req.thinking_budget,
            speculation,
            images,
            events: events_tx,
            submitted: Instant::now(),
        });
        self.tx
            .send(Command::Add(Box::new(seq)))
            .map_err(|_| Error::EngineStopped)?;
        Ok(Generation {
            control: Control {
                id,
                tx: self.tx.clone(),
            },
            prompt_tokens,
            events,
        })
    }

    /// The images of a conversation's prompt, each where its rows go, encoded (or kept from
    /// an earlier request).
    fn prompt_images(&self, prompt: &Prompt, ids: &[u32]) -> Result<Vec<PromptImage>> {
        let Some(vision) = &self.shared.vision else {
            return Ok(Vec::new());
        };
        let images: Vec<&ImageData> = match prompt {
            Prompt::Messages(messages) => messages.iter().flat_map(|m| &m.images).collect(),
            Prompt::Pictured { images, .. } => images.iter().collect(),
            Prompt::Text(_) | Prompt::Tokens(_) => Vec::new(),
        };
        match images.is_empty() {
            true => Ok(Vec::new()),
            false => vision.place(ids, &images),
        }
    }

    /// Refuses, before anything is written, images this model cannot take: any at all when
    /// it has no vision projector, and bytes that are not a picture Rill decodes (checked
    /// whole, so a damaged file is named now rather than when its answer starts).
    pub fn check_images(&self, images: &[ImageData]) -> Result<()> {
        if images.is_empty() {
            return Ok(());
        }
        if self.shared.vision.is_none() {
            return Err(crate::prompting::no_projector());
        }
        for (i, image) in images.iter().enumerate() {
            crate::vision::Picture::decode(image.bytes())
                .map_err(|e| Error::Image(format!("image {}: {e}", i + 1)))?;
        }
        Ok(())
    }

    /// Whether the model reads images (a vision projector is paired with it).
    pub fn reads_images(&self) -> bool {
        self.shared.vision.is_some()
    }

    /// The vision projector's file, when the model has one.
    pub fn projector_path(&self) -> Option<&Path> {
        self.shared.vision.as_ref().map(|v| v.projector().path())
    }

    /// Images encoded so far (an image seen lately is not encoded again).
    pub fn images_encoded(&self) -> usize {
        self.shared.vision.as_ref().map_or(0, |v| v.encoded())
    }

    /// The chat side of the model, for rendering and tokenising prompts (`prompting.rs`).
    fn prompter(&self) -> Prompter<'_> {
        Prompter {
            template: &self.shared.template,
            tokenizer: &self.shared.tokenizer,
            context_length: self.shared.context_length,
            thinking: self.shared.info.thinking,
            vision: self.shared.vision.as_ref(),
        }
    }

    /// Renders a conversation with the model's chat template, ready for the answer.
    pub fn render(&self, messages: &[Message]) -> Result<String> {
        self.prompter().render_chat(messages, &ChatArgs::default())
    }

    /// [`render`](Self::render) with tools and template variables. A template that does not
    /// read `tools` gets them described in the system message, and past calls and results
    /// written out, in the Hermes format.
    pub fn render_chat(&self, messages: &[Message], args: &ChatArgs) -> Result<String> {
        self.prompter().render_chat(messages, args)
    }

    /// [`render_chat`](Self::render_chat) with each message's images standing before its text
    /// as [`IMAGE_MARKER`](crate::message::IMAGE_MARKER)s, for a [`Prompt::Pictured`] (an
    /// answer about a picture continued).
    pub fn render_chat_marked(&self, messages: &[Message], args: &ChatArgs) -> Result<String> {
        self.prompter().render_marked(messages, args)
    }

    /// How this model writes tool calls (from its chat template).
    pub fn tool_format(&self) -> ToolFormat {
        self.prompter().tool_format()
    }

    /// The grammar that makes the model call `tools` (name, parameter schema) in its own
    /// format, one call or several (`parallel`); `None` where the format cannot be forced
    /// yet (harmony) or the model's vocabulary lacks the format's control tokens.
    pub fn tool_grammar(&self, tools: &[(String, Value)], parallel: bool) -> Option<String> {
        self.prompter().tool_grammar(tools, parallel)
    }

    /// The prompt's token ids, as the engine will run them.
    pub fn tokenize_prompt(&self, prompt: &Prompt) -> Result<Vec<u32>> {
        self.prompter().tokenize_chat(prompt, &ChatArgs::default())
    }

    /// [`tokenize_prompt`](Self::tokenize_prompt), a conversation rendered with `args`.
    pub fn tokenize_chat(&self, prompt: &Prompt, args: &ChatArgs) -> Result<Vec<u32>> {
        self.prompter().tokenize_chat(prompt, args)
    }

    /// The distribution the first token of an answer to `prompt` is drawn from under
    /// `params`. The prompt goes through the model like any other (sharing the machine, reusing
    /// cached prefixes); its logits are then kept, so asking again for the same prompt with
    /// other parameters (a slider moving) is answered at once without the model.
    pub async fn preview(&self, req: PreviewRequest) -> Result<Distribution> {
        let sampler = Sampler::new(req.params)?;
        let (prompt, dropped_messages) = self.prompter().fit(
            &req.prompt,
            &ChatArgs::default(),
            None,
            Overflow::DropOldest,
        )?;
        let images = self.prompt_images(&req.prompt, &prompt)?;
        let (events_tx, events) = unbounded_channel();
        let seq = Sequence::new(SequenceSpec {
            id: self.shared.next_id.fetch_add(1, Ordering::Relaxed),
            prompt,
            sampler,
            stops: StopStrings::new(Vec::new()),
            decoder: StreamDecoder::new(&self.shared.tokenizer),
            max_tokens: None,
            context_length: self.shared.context_length,
            ignore_eos: false,
            priority: 1,
            dropped_messages,
            top_candidates: req.top.clamp(1, MAX_CANDIDATES),
            constraint: None,
            split: None,
            thinking_budget: None,
            speculation: Speculation::Off,
            images,
            events: events_tx,
            submitted: Instant::now(),
        })
        .into_preview();
        let (reply, answer) = oneshot::channel();
        self.send(Command::Preview(Box::new(PreviewJob { seq, reply })))?;
        // The events receiver lives until the answer: dropping this future cancels the work.
        let result = answer.await.map_err(|_| Error::EngineStopped)?;
        drop(events);
        result
    }

    /// The draft model answers can ask for ([`crate::Speculation::Draft`]), if one is loaded.
    pub fn draft_model(&self) -> Option<DraftInfo> {
        self.shared.draft.lock().ok().and_then(|d| d.clone())
    }

    /// Loads `path` as the draft model (on the caller's thread: seconds for a large file),
    /// or drops the draft model with `None`. A file of another vocabulary is refused, and the
    /// draft model before stays. Answers drafting now go on with the new one.
    pub fn set_draft_model(&self, path: Option<&Path>) -> Result<Option<DraftInfo>> {
        let loaded = match path {
            Some(p) => Some(DraftModel::load(
                p,
                &self.shared.device,
                &self.shared.tokenizer,
                self.shared.context_length,
            )?),
            None => None,
        };
        let (model, info) = loaded.map_or((None, None), |(m, i)| (Some(Box::new(m)), Some(i)));
        self.send(Command::SetDraft(model))?;
        if let Ok(mut d) = self.shared.draft.lock() {
            d.clone_from(&info);
        }
        Ok(info)
    }
}
