//! Tokenizer built from GGUF metadata, and a streaming, UTF-8-safe detokenizer.
//!
//! GGUF files carry their vocabulary in `tokenizer.ggml.*`. Two families exist, and we build a
//! HF `tokenizers` pipeline for each the way llama.cpp interprets them (`llama-vocab.cpp`):
//!
//! - `gpt2`: byte-level BPE from `tokens` + `merges`. The pre-tokenizer (how text is split
//!   before BPE) is named by `tokenizer.ggml.pre`; it matters: SmolLM2 declares `smollm`, which
//!   splits every digit on its own before the GPT-2 regex, and default byte-level settings give
//!   other ids for numbers. [`pre_tokenizer_for`] maps each name to its regexes.
//! - `llama`: SentencePiece BPE from `tokens` + `scores` with byte fallback (`<0x0A>`). GGUF has
//!   no merge list for these, so we derive one from the scores, as HF's converter does.
//!
//! A `tokenizer.json` beside the GGUF file wins over the metadata (some files ship a better one).
//! Control tokens (`<|im_start|>`, …) in the prompt text are parsed as single tokens.
//!
//! Decoding to text is ours, not the library's: every id maps to the raw bytes it stands for
//! ([`Tokenizer::piece_bytes`]), and [`StreamDecoder`] releases only complete UTF-8 characters,
//! so an emoji split over three byte tokens comes out whole, once.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::AddedToken;
use tokenizers::NormalizerWrapper;

use crate::error::{candle_message, Error, Result};

mod pre;
mod stream;
use pre::pre_tokenizer_for;
pub use stream::StreamDecoder;

pub(crate) type Metadata = HashMap<String, Value>;

/// GGUF token types (llama.cpp `llama_token_type`).
const TOKEN_TYPE_UNKNOWN: i32 = 2;
const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;
const TOKEN_TYPE_BYTE: i32 = 6;

/// Texts of control tokens that end a turn in common templates; llama.cpp treats them as
/// end-of-generation too, whatever `eos_token_id` says.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "</s>",
    "<|end_of_text|>",
    // gpt-oss's harmony: the end of an answer, and of a message that calls a tool.
    "<|return|>",
    "<|call|>",
];

/// A model's tokenizer: text ⇄ ids, plus the special ids the engine needs.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// The bytes each id stands for; empty for control tokens.
    pieces: Vec<Vec<u8>>,
    bos: Option<u32>,
    eos: Option<u32>,
    eog: Vec<u32>,
    add_bos: bool,
    /// SentencePiece adds a space before the first word; it is not part of the answer.
    strip_leading_space: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab", &self.pieces.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .finish()
    }
}

fn md_str<'a>(md: &'a Metadata, key: &str) -> Option<&'a str> {
    md.get(key)
        .and_then(|v| v.to_string().ok())
        .map(|s| s.as_str())
}

fn md_u32(md: &Metadata, key: &str) -> Option<u32> {
    md.get(key).and_then(|v| {
        v.to_u32()
            .ok()
            .or_else(|| v.to_i32().ok().map(|x| x as u32))
    })
}

fn md_bool(md: &Metadata, key: &str) -> Option<bool> {
    md.get(key).and_then(|v| v.to_bool().ok())
}

fn md_array<'a>(md: &'a Metadata, key: &str) -> Result<&'a Vec<Value>> {
    md.get(key)
        .ok_or_else(|| Error::Tokenizer(format!("the file has no `{key}`")))?
        .to_vec()
        .map_err(|e| Error::Tokenizer(format!("`{key}`: {}", candle_message(&e))))
}

/// The array at `key` read with `each` (which gives its fallback for a value of another
/// type), or `None` when the file has no such key.
fn md_values<T>(md: &Metadata, key: &str, each: impl Fn(&Value) -> T) -> Result<Option<Vec<T>>> {
    match md.get(key) {
        None => Ok(None),
        Some(_) => Ok(Some(md_array(md, key)?.iter().map(each).collect())),
    }
}

fn md_strings(md: &Metadata, key: &str) -> Result<Vec<String>> {
    md_array(md, key)?
        .iter()
        .map(|v| {
            v.to_string()
                .cloned()
                .map_err(|e| Error::Tokenizer(format!("`{key}`: {}", candle_message(&e))))
        })
        .collect()
}

/// GPT-2's reversible map from bytes to printable characters (`bytes_to_unicode` in GPT-2's
/// encoder.py): printable Latin-1 maps to itself, the other 68 bytes to U+0100 upwards.
fn byte_level_chars() -> HashMap<char, u8> {
    let mut map = HashMap::with_capacity(256);
    let mut next = 0u32;
    for b in 0u8..=255 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let c = if printable {
            b as char
        } else {
            next += 1;
            char::from_u32(255 + next).expect("U+0100..U+0143 are valid chars")
        };
        map.insert(c, b);
    }
    map
}

impl Tokenizer {
    /// Builds the tokenizer of a GGUF file. `beside` is the file's folder: a `tokenizer.json`
    /// there is used for encoding instead of the metadata.
    pub(crate) fn from_gguf(md: &Metadata, beside: Option<&Path>) -> Result<Self> {
        let model = md_str(md, "tokenizer.ggml.model").unwrap_or("gpt2");
        let tokens = md_strings(md, "tokenizer.ggml.tokens")?;
        let types = md_values(md, "tokenizer.ggml.token_type", |t| t.to_i32().unwrap_or(1))?
            .unwrap_or_else(|| vec![1; tokens.len()]);
        if types.len() != tokens.len() {
            return Err(Error::Tokenizer(format!(
                "{} token types for {} tokens",
                types.len(),
                tokens.len()
            )));
        }
        let ty = |i: usize| types[i];

        // Whether a BOS is added when the file does not say: llama.cpp's default for the type.
        let mut default_bos = model == "llama";
        let (mut inner, pieces, strip_leading_space) = match model {
            "gpt2" => {
                let pre = md_str(md, "tokenizer.ggml.pre").unwrap_or("default");
                let pre = pre_tokenizer_for(pre)?;
                default_bos = pre.add_bos;
                let bpe = merged_bpe(md, &tokens, |b| b.ignore_merges(pre.ignore_merges))?;
                let mut t = tokenizers::Tokenizer::new(bpe);
                t.with_pre_tokenizer(Some(pre.tokenizer));
                let chars = byte_level_chars();
                let pieces = tokens
                    .iter()
                    .enumerate()
                    .map(|(i, t)| match ty(i) {
                        TOKEN_TYPE_CONTROL => Vec::new(),
                        TOKEN_TYPE_USER_DEFINED => t.as_bytes().to_vec(),
                        _ => t
                            .chars()
                            .flat_map(|c| match chars.get(&c) {
                                Some(&b) => vec![b],
                                None => c.to_string().into_bytes(),
                            })
                            .collect(),
                    })
                    .collect();
                (t, pieces, false)
            }
            "gemma4" => {
                // BPE over raw UTF-8 with `▁` for spaces, byte fallback as `<0xXX>` tokens
                // (llama.cpp's "gemma4" tokenizer).
                let bpe = merged_bpe(md, &tokens, |b| b.byte_fallback(true))?;
                let mut t = tokenizers::Tokenizer::new(bpe);
                t.with_normalizer(Some(
                    Replace::new(" ", "▁")
                        .map_err(|e| Error::Tokenizer(format!("normalizer: {e}")))?,
                ));
                t.with_pre_tokenizer(Some(pre::gemma4()?));
                (t, spm_pieces(&tokens, &ty), false)
            }
            "llama" => {
                let scores = md_values(md, "tokenizer.ggml.scores", |s| s.to_f32().unwrap_or(0.0))?
                    .unwrap_or_else(|| (0..tokens.len()).map(|i| -(i as f32)).collect());
                let bpe = spm_bpe(
                    &tokens,
                    &scores,
                    &types,
                    md_u32(md, "tokenizer.ggml.unknown_token_id"),
                )?;
                let mut t = tokenizers::Tokenizer::new(bpe);
                let add_space = md_bool(md, "tokenizer.ggml.add_space_prefix").unwrap_or(true);
                // As llama.cpp's SPM tokenizer: every run of text (the first, and each after a
                // control token) gets a space in front when the vocabulary asks for it, even
                // one that starts with spaces; then spaces become `▁`. (A Metaspace
                // pre-tokenizer adds no `▁` to text that already starts with a space.)
                let mut steps: Vec<NormalizerWrapper> = Vec::new();
                if add_space {
                    steps.push(Prepend::new("▁".into()).into());
                }
                steps.push(
                    Replace::new(" ", "▁")
                        .map_err(|e| Error::Tokenizer(format!("normalizer: {e}")))?
                        .into(),
                );
                t.with_normalizer(Some(NormalizerSequence::new(steps)));
                (t, spm_pieces(&tokens, &ty), add_space)
            }
            other => {
                return Err(Error::Tokenizer(format!(
                    "unsupported tokenizer model `{other}` (supported: gpt2, llama, gemma4)"
                )))
            }
        };

        // Control and user-defined tokens are matched whole in the text, before BPE. In a
        // Phi-3 model (llama.cpp tells them by name) each also takes the whitespace after it,
        // but for `<unk>`, `<s>` and `<|endoftext|>`, as llama.cpp's tokenizer does.
        let phi3 = md_str(md, "general.name")
            .map(str::to_lowercase)
            .is_some_and(|n| n.contains("phi-3") || n.contains("phi3"));
        let added: Vec<AddedToken> = tokens
            .iter()
            .enumerate()
            .filter(|&(i, _)| matches!(ty(i), TOKEN_TYPE_CONTROL | TOKEN_TYPE_USER_DEFINED))
            .map(|(i, t)| {
                let token = AddedToken::from(t.clone(), ty(i) == TOKEN_TYPE_CONTROL);
                let rstrip = phi3 && !["<unk>", "<s>", "<|endoftext|>"].contains(&t.as_str());
                token.normalized(false).rstrip(rstrip)
            })
            .collect();
        inner.add_special_tokens(&added);

        if let Some(json) = beside
            .map(|d| d.join("tokenizer.json"))
            .filter(|p| p.is_file())
        {
            tracing::info!(path = %json.display(), "using tokenizer.json beside the model");
            inner = tokenizers::Tokenizer::from_file(&json)
                .map_err(|e| Error::Tokenizer(format!("{}: {e}", json.display())))?;
        }

        let bos = md_u32(md, "tokenizer.ggml.bos_token_id");
        let eos = md_u32(md, "tokenizer.ggml.eos_token_id");
        let mut eog: Vec<u32> = ["eos", "eot", "eom"]
            .iter()
            .filter_map(|k| md_u32(md, &format!("tokenizer.ggml.{k}_token_id")))
            .collect();
        for (i, t) in tokens.iter().enumerate() {
            if ty(i) == TOKEN_TYPE_CONTROL && EOG_TEXTS.contains(&t.as_str()) {
                eog.push(i as u32);
            }
        }
        // Harmony (gpt-oss): `<|end|>` ends a message, not the answer, which goes on with the
        // next (analysis, then final); where `<|return|>` and `<|call|>` end answers, it is
        // taken off the list (llama.cpp's workaround for o200k_harmony).
        let named = |text: &str| {
            eog.iter()
                .any(|&i| tokens.get(i as usize).is_some_and(|t| t == text))
        };
        if named("<|return|>") && named("<|call|>") {
            eog.retain(|&i| tokens.get(i as usize).is_none_or(|t| t != "<|end|>"));
        }
        eog.sort_unstable();
        eog.dedup();
        // llama.cpp's defaults when the file says nothing; Gemma 4 always starts with BOS.
        let add_bos = match model {
            "gemma4" => true,
            _ => md_bool(md, "tokenizer.ggml.add_bos_token").unwrap_or(default_bos),
        };
        Ok(Tokenizer {
            inner,
            pieces,
            bos,
            eos,
            eog,
            add_bos,
            strip_leading_space,
        })
    }

    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// The text of a token as written in the vocabulary (`<|im_end|>` for a control token).
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The ids that end a generation, sorted.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    /// True for ids that end a generation (EOS, end-of-turn, …).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// Encodes prompt text, parsing control tokens, and adds BOS when the model asks for it
    /// and the text does not already start with it (a template often writes it itself).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.encode_with(text, true)
    }

    /// Encodes text; with `add_special`, a BOS is added as [`encode`](Self::encode) does
    /// (llama.cpp's `add_special`). Without, the ids are the text's alone, as llama.cpp's
    /// tokenizer tests and `llama-tokenize --no-bos` give them.
    pub fn encode_with(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| Error::Tokenizer(format!("encode: {e}")))?;
        let mut ids = enc.get_ids().to_vec();
        if let (true, true, Some(bos)) = (add_special, self.add_bos, self.bos) {
            if ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
        }
        Ok(ids)
    }

    /// The tokenizer of a GGUF file, from its metadata alone (a vocab-only file will do), or
    /// from a `tokenizer.json` beside it, as the engine loads it.
    pub fn from_file(path: &Path) -> Result<Tokenizer> {
        let mut f =
            std::fs::File::open(path).map_err(|e| Error::model_file(path, e.to_string()))?;
        let len = f
            .metadata()
            .map_err(|e| Error::model_file(path, e.to_string()))?
            .len();
        let mut reader = std::io::BufReader::new(&mut f);
        let content = crate::gguf::read(&mut reader, len)
            .map_err(|e| Error::model_file(path, e.to_string()))?;
        Tokenizer::from_gguf(&content.metadata, path.parent())
    }

    /// The raw bytes a token stands for (empty for control tokens and unknown ids).
    pub fn piece_bytes(&self, id: u32) -> &[u8] {
        self.pieces
            .get(id as usize)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// Decodes a whole sequence (lossy on invalid UTF-8).
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut d = StreamDecoder::new(self);
        let mut s: String = ids.iter().map(|&id| d.push(self, id)).collect();
        s.push_str(&d.flush());
        s
    }
}

/// A BPE model from the file's tokens and `tokenizer.ggml.merges` (rank = order), with the
/// options `with` sets.
fn merged_bpe(
    md: &Metadata,
    tokens: &[String],
    with: impl FnOnce(tokenizers::models::bpe::BpeBuilder) -> tokenizers::models::bpe::BpeBuilder,
) -> Result<BPE> {
    let merges = md_strings(md, "tokenizer.ggml.merges")?
        .iter()
        .map(|m| split_merge(m))
        .collect::<Result<Vec<_>>>()?;
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    with(BPE::builder().vocab_and_merges(vocab, merges))
        .build()
        .map_err(|e| Error::Tokenizer(format!("BPE: {e}")))
}

/// A merge rule `a b`, split at the first space after the first character (a merge of a
/// space-like token such as Gemma's `▁` keeps it whole), as llama.cpp does.
fn split_merge(m: &str) -> Result<(String, String)> {
    let at = m
        .char_indices()
        .skip(1)
        .find(|&(_, c)| c == ' ')
        .map(|(i, _)| i)
        .ok_or_else(|| Error::Tokenizer(format!("malformed merge `{m}`")))?;
    Ok((m[..at].to_owned(), m[at + 1..].to_owned()))
}

/// The bytes each token of a SentencePiece-style vocabulary stands for: `▁` is a space, byte
/// tokens `<0xXX>` are their byte, control tokens are nothing.
fn spm_pieces(tokens: &[String], ty: &impl Fn(usize) -> i32) -> Vec<Vec<u8>> {
    tokens
        .iter()
        .enumerate()
        .map(|(i, t)| match ty(i) {
            TOKEN_TYPE_CONTROL => Vec::new(),
            TOKEN_TYPE_BYTE => parse_byte_token(t).map(|b| vec![b]).unwrap_or_default(),
            _ => t.replace('▁', " ").into_bytes(),
        })
        .collect()
}

fn parse_byte_token(t: &str) -> Option<u8> {
    let hex = t.strip_prefix("<0x")?.strip_suffix('>')?;
    u8::from_str_radix(hex, 16).ok()
}

/// SentencePiece-style BPE: merge order comes from the scores of the merged pieces (higher
/// first), like `tokenizers`' `SentencePieceExtractor` and llama.cpp's `llm_tokenizer_spm`.
fn spm_bpe(tokens: &[String], scores: &[f32], types: &[i32], unk: Option<u32>) -> Result<BPE> {
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let mut merges: Vec<(f32, u32, u32, String, String)> = Vec::new();
    for (i, piece) in tokens.iter().enumerate() {
        if types[i] != 1 {
            continue;
        }
        for (at, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(at);
            if let (Some(&li), Some(&ri)) = (vocab.get(l), vocab.get(r)) {
                merges.push((
                    scores.get(i).copied().unwrap_or(0.0),
                    li,
                    ri,
                    l.to_owned(),
                    r.to_owned(),
                ));
            }
        }
    }
    merges.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let merges = merges.into_iter().map(|m| (m.3, m.4)).collect::<Vec<_>>();
    let mut b = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(u) = unk.and_then(|u| tokens.get(u as usize)).or_else(|| {
        types
            .iter()
            .position(|&t| t == TOKEN_TYPE_UNKNOWN)
            .map(|i| &tokens[i])
    }) {
        b = b.unk_token(u.clone());
    }
    b.build().map_err(|e| Error::Tokenizer(format!("BPE: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_map_is_a_bijection_with_gpt2s_choices() {
        let m = byte_level_chars();
        assert_eq!(m.len(), 256);
        assert_eq!(m[&'Ġ'], b' ');
        assert_eq!(m[&'Ċ'], b'\n');
        assert_eq!(m[&'A'], b'A');
    }

    fn md(entries: Vec<(&str, Value)>) -> Metadata {
        entries
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect()
    }

    fn strings(v: &[&str]) -> Value {
        Value::Array(v.iter().map(|s| Value::String(s.to_string())).collect())
    }

    /// A tiny SentencePiece-style vocabulary: merges come from the scores, unknown characters
    /// fall back to byte tokens, and the leading space SentencePiece adds is not decoded.
    #[test]
    fn sentencepiece_vocabularies_merge_by_score_and_fall_back_to_bytes() {
        let tokens = [
            "<unk>", "<s>", "</s>", "<0x0A>", "<0xC3>", "<0xA9>", "▁", "h", "e", "l", "o", "▁h",
            "ll", "llo", "ello", "▁hello", "w", "r", "d", "▁w", "or", "▁wor", "▁world", "ld",
        ];
        let mut types = vec![1i32; tokens.len()];
        types[0] = TOKEN_TYPE_UNKNOWN;
        types[1] = TOKEN_TYPE_CONTROL;
        types[2] = TOKEN_TYPE_CONTROL;
        for t in &mut types[3..6] {
            *t = TOKEN_TYPE_BYTE;
        }
        let scores: Vec<Value> = (0..tokens.len()).map(|i| Value::F32(-(i as f32))).collect();
        let m = md(vec![
            ("tokenizer.ggml.model", Value::String("llama".into())),
            ("tokenizer.ggml.tokens", strings(&tokens)),
            ("tokenizer.ggml.scores", Value::Array(scores)),
            (
                "tokenizer.ggml.token_type",
                Value::Array(types.iter().map(|&t| Value::I32(t)).collect()),
            ),
            ("tokenizer.ggml.bos_token_id", Value::U32(1)),
            ("tokenizer.ggml.eos_token_id", Value::U32(2)),
        ]);
        let tok = Tokenizer::from_gguf(&m, None).unwrap();
        let id = |t: &str| tokens.iter().position(|x| *x == t).unwrap() as u32;
        // BOS is added (llama-style files default to add_bos), then whole words.
        assert_eq!(
            tok.encode("hello world").unwrap(),
            vec![1, id("▁hello"), id("▁world")]
        );
        // "é" is not in the vocabulary: its two UTF-8 bytes become byte tokens.
        let ids = tok.encode("hello é\n").unwrap();
        assert!(
            ids.ends_with(&[id("<0xC3>"), id("<0xA9>"), id("<0x0A>")]),
            "{ids:?}"
        );
        assert_eq!(tok.decode(&ids), "hello é\n");
        assert!(tok.is_eog(2) && !tok.is_eog(1));
    }

    #[test]
    fn byte_tokens_parse() {
        assert_eq!(parse_byte_token("<0x0A>"), Some(10));
        assert_eq!(parse_byte_token("<0xFF>"), Some(255));
        assert_eq!(parse_byte_token("hello"), None);
    }
}
