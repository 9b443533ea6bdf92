//! Constrained decoding: an answer that must match a JSON schema or a Lark grammar.
//!
//! The grammar work is llguidance's (the library llama.cpp and mistral.rs use); this module
//! connects it to the engine:
//!
//! - [`Grammars`] builds llguidance's token trie from our tokenizer once per engine, on the first
//!   constrained request (ordinary tokens are their bytes; control tokens are marked the way
//!   toktrie marks special tokens, `0xFF` then their text), and compiles a [`Grammar`]. A
//!   grammar it refuses is an [`Error::Grammar`] that names the problem, before anything runs.
//! - A [`Constraint`] follows one answer. It computes the mask of allowed tokens for the next
//!   position on a thread of its own, started as soon as the last token is known, so the mask
//!   is ready when the forward pass is (it is computed beside the pass, not after it).
//! - The sequence applies the mask to the logits *before* its sampler runs: disallowed tokens
//!   get −∞, so temperature, top-k, top-p, min-p and the penalties all work within the mask.
//! - A JSON grammar is written compactly (`{"a": 1, "b": [2, 3]}`): the model cannot pad it
//!   with whitespace until the length limit cuts it. A schema's own `x-guidance` wins.
//! - As the length limit nears, tokens that close a JSON string, array or object are
//!   favoured ([`closing`]), so an answer with a `max_tokens` cap ends as valid JSON rather
//!   than being cut mid-value. Within the mask this changes which allowed token is likeliest,
//!   never what is allowed.

use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;

mod closing;
use closing::{Closing, ClosingTokens};

/// What an answer must match.
#[derive(Clone, Debug, PartialEq)]
pub enum Grammar {
    /// A JSON Schema (OpenAI's `response_format: {"type": "json_schema"}`).
    JsonSchema(Value),
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// A grammar in Lark, llguidance's own grammar language.
    Lark(String),
    /// Tool calls a client insists on (`tool_choice`), as a Lark grammar of the model's call
    /// format around JSON ([`crate::tools::prompt::grammar`]); steered to close as JSON is.
    ToolCalls(String),
}

impl Grammar {
    /// The grammar as text, to know it again.
    fn key(&self) -> String {
        format!("{self:?}")
    }

    fn is_json(&self) -> bool {
        !matches!(self, Grammar::Lark(_))
    }

    /// llguidance's form of it, compact JSON unless the schema says otherwise.
    fn to_top_level(&self) -> Result<TopLevelGrammar> {
        let compact = || json!({ "whitespace_flexible": false, "item_separator": ", ", "key_separator": ": " });
        Ok(match self {
            Grammar::JsonSchema(schema) => {
                let Value::Object(map) = schema else {
                    return Err(Error::Grammar(
                        "a JSON schema must be a JSON object".to_string(),
                    ));
                };
                let mut map = map.clone();
                map.entry("x-guidance").or_insert_with(compact);
                TopLevelGrammar::from_json_schema(Value::Object(map))
            }
            Grammar::JsonObject => TopLevelGrammar::from_json_schema(
                json!({ "type": "object", "x-guidance": compact() }),
            ),
            Grammar::Lark(text) if text.trim().is_empty() => {
                return Err(Error::Grammar("the grammar is empty".to_string()))
            }
            Grammar::Lark(text) | Grammar::ToolCalls(text) => {
                TopLevelGrammar::from_lark(text.clone())
            }
        })
    }
}

/// Our tokenizer as llguidance sees it: each id's bytes, and text → ids.
struct TokenBytes {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for TokenBytes {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// `s` as ids whose bytes are exactly `s`: the tokenizer's own ids where they are, else
    /// the trie's greedy split. (A SentencePiece tokenizer puts a space before the text, `[`
    /// becoming `▁[`: llguidance would then allow a token its grammar refuses.)
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        let exact = |ids: &[u32]| {
            ids.iter()
                .flat_map(|&id| self.tokenizer.piece_bytes(id).iter().copied())
                .eq(s.iter().copied())
        };
        match std::str::from_utf8(s).map(|text| self.tokenizer.encode_with(text, false)) {
            Ok(Ok(ids)) if exact(&ids) => ids,
            _ => self.trie.greedy_tokenize(s),
        }
    }
}

/// Compiles grammars for one engine's tokenizer; the trie is built on first use.
pub(crate) struct Grammars {
    tokenizer: Arc<Tokenizer>,
    factory: OnceLock<std::result::Result<Arc<ParserFactory>, String>>,
    /// The tokens that can close a JSON string, array or object.
    closers: OnceLock<Arc<ClosingTokens>>,
    /// Matchers that [`Grammars::check`] compiled, kept for the answer that follows the check
    /// (the API checks a grammar before it saves or starts anything): a large schema is then
    /// compiled once, not twice. The newest few, each taken by one answer.
    checked: Mutex<Vec<(String, Matcher)>>,
}

/// How many checked matchers are kept for the answers that follow their checks.
const CHECKED_KEPT: usize = 4;

impl Grammars {
    pub fn new(tokenizer: Arc<Tokenizer>) -> Self {
        Grammars {
            tokenizer,
            factory: OnceLock::new(),
            closers: OnceLock::new(),
            checked: Mutex::new(Vec::new()),
        }
    }

    fn factory(&self) -> Result<Arc<ParserFactory>> {
        self.factory
            .get_or_init(|| {
                let t = &self.tokenizer;
                let words: Vec<Vec<u8>> = (0..t.vocab_size() as u32)
                    .map(|id| match t.piece_bytes(id) {
                        [] => {
                            // Control tokens: toktrie's special-token form, so a Lark grammar
                            // can name them (`<|im_end|>`) and no text can spell them.
                            let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                            w.extend(t.token_text(id).unwrap_or_default().into_bytes());
                            w
                        }
                        bytes => bytes.to_vec(),
                    })
                    .collect();
                let eog = t.eog_ids();
                let eos = t.eos_id().or(eog.first().copied()).unwrap_or(0);
                let info = TokRxInfo::new(words.len() as u32, eos);
                let mut trie = TokTrie::from(&info, &words);
                if !eog.is_empty() {
                    trie = trie.with_eos_tokens(eog);
                }
                let env: TokEnv = Arc::new(TokenBytes {
                    trie,
                    tokenizer: t.clone(),
                });
                let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
                factory.quiet();
                tracing::info!(vocab = words.len(), "constrained decoding ready");
                Ok(Arc::new(factory))
            })
            .clone()
            .map_err(|e| Error::Grammar(format!("cannot build the token trie: {e}")))
    }

    fn closing(&self) -> Closing {
        let tokens = self
            .closers
            .get_or_init(|| Arc::new(ClosingTokens::new(&self.tokenizer)))
            .clone();
        Closing::new(tokens, self.tokenizer.clone())
    }

    /// A matcher at the start of `grammar`, or the reason llguidance refuses it.
    pub fn matcher(&self, grammar: &Grammar) -> Result<Matcher> {
        let factory = self.factory()?;
        let parser = factory
            .create_parser(grammar.to_top_level()?)
            .map_err(|e| Error::Grammar(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        match matcher.get_error() {
            Some(e) => Err(Error::Grammar(e)),
            None => Ok(matcher),
        }
    }

    /// Checks that `grammar` can be used, keeping its matcher for the answer that follows.
    pub fn check(&self, grammar: &Grammar) -> Result<()> {
        let matcher = self.matcher(grammar)?;
        if let Ok(mut kept) = self.checked.lock() {
            if kept.len() >= CHECKED_KEPT {
                kept.remove(0);
            }
            kept.push((grammar.key(), matcher));
        }
        Ok(())
    }

    /// Compiles `grammar` into a constraint for one answer (or takes the matcher its check
    /// kept); its first mask is computed while the prompt is prefilled.
    pub fn compile(&self, grammar: &Grammar) -> Result<Constraint> {
        let key = grammar.key();
        let kept = self.checked.lock().ok().and_then(|mut kept| {
            let i = kept.iter().position(|(k, _)| *k == key)?;
            Some(kept.remove(i).1)
        });
        let matcher = match kept {
            Some(m) => m,
            None => self.matcher(grammar)?,
        };
        let mut c = Constraint {
            state: State::Idle(Box::new(matcher)),
            closing: grammar.is_json().then(|| self.closing()),
        };
        c.start();
        Ok(c)
    }
}

enum State {
    /// Between a commit and the next mask.
    Idle(Box<Matcher>),
    /// The next mask is being computed on its own thread.
    Computing(JoinHandle<(Box<Matcher>, std::result::Result<SimpleVob, String>)>),
    /// A matcher thread panicked; the answer fails with an error.
    Broken,
}

/// One answer's grammar state.
pub(crate) struct Constraint {
    state: State,
    /// The push to close a JSON answer before its limit (JSON grammars only).
    closing: Option<Closing>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("json", &self.closing.is_some())
            .finish()
    }
}

fn broken() -> Error {
    Error::Grammar("the grammar matcher failed".to_string())
}

impl Constraint {
    /// Starts computing the next mask in the background.
    fn start(&mut self) {
        let state = std::mem::replace(&mut self.state, State::Broken);
        self.state = match state {
            State::Idle(mut m) => {
                let spawned = std::thread::Builder::new()
                    .name("rill-grammar".into())
                    .spawn(move || {
                        let mask = m.compute_mask_or_eos().map_err(|e| e.to_string());
                        (m, mask)
                    });
                match spawned {
                    Ok(h) => State::Computing(h),
                    Err(e) => {
                        tracing::warn!(error = %e, "no thread for the grammar mask");
                        State::Broken
                    }
                }
            }
            other => other,
        };
    }

    /// Waits for the mask and applies it: disallowed tokens get −∞ (ids past the tokenizer's
    /// vocabulary, which some models' output rows have, are never allowed). `left` is how
    /// many tokens the answer may still take (its length limit, or the context's room).
    pub fn apply(&mut self, logits: &mut [f32], left: usize) -> Result<()> {
        let state = std::mem::replace(&mut self.state, State::Broken);
        let State::Computing(h) = state else {
            return Err(broken());
        };
        let (matcher, mask) = h.join().map_err(|_| broken())?;
        let mask = match mask {
            Ok(mask) => mask,
            Err(e) => return Err(Error::Grammar(e)),
        };
        self.state = State::Idle(matcher);
        for (id, l) in logits.iter_mut().enumerate() {
            if id >= mask.len() || !mask.is_allowed(id as u32) {
                *l = f32::NEG_INFINITY;
            }
        }
        if let Some(c) = &mut self.closing {
            c.steer(logits, left);
        }
        Ok(())
    }

    /// Takes the drawn token, and starts on the next mask. Returns true when the grammar is
    /// complete and nothing but the end of the answer may follow.
    pub fn commit(&mut self, id: u32) -> Result<bool> {
        let State::Idle(m) = &mut self.state else {
            return Err(broken());
        };
        m.consume_token(id)
            .map_err(|e| Error::Grammar(e.to_string()))?;
        if let Some(c) = &mut self.closing {
            c.push(id);
        }
        let done = m.is_stopped();
        if !done {
            self.start();
        }
        Ok(done)
    }
}
