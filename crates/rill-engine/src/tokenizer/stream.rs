//! The streaming detokenizer: token ids in, text out, never a character cut in two. Each id
//! maps to the raw bytes it stands for ([`Tokenizer::piece_bytes`]); only complete UTF-8
//! characters are released, so an emoji split over three byte tokens comes out whole, once.

use super::Tokenizer;

/// Turns a stream of token ids into a stream of text without ever cutting a character.
#[derive(Clone, Debug, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
    strip_leading_space: bool,
    /// Control tokens written as their text (a tool format's markers).
    shown: Vec<u32>,
}

impl StreamDecoder {
    /// For a new answer: the space a SentencePiece vocabulary writes in front of its first
    /// word is dropped, as the tokenizer added it.
    pub fn new(tokenizer: &Tokenizer) -> Self {
        StreamDecoder {
            pending: Vec::new(),
            strip_leading_space: tokenizer.strip_leading_space,
            shown: Vec::new(),
        }
    }

    /// Writes these control tokens as their text instead of nothing.
    pub fn show(&mut self, ids: Vec<u32>) {
        self.shown = ids;
    }

    /// For text that continues a prompt (a raw completion, a continued answer): every space is
    /// kept, the first token's too ("and then" + " Pays"), as llama.cpp gives it.
    pub fn continuing() -> Self {
        StreamDecoder::default()
    }

    /// The text that token `id` completes: possibly empty (half a character so far), possibly
    /// more than the token (the rest of a character started earlier).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> String {
        match self.shown.contains(&id).then(|| tokenizer.token_text(id)) {
            Some(Some(text)) => self.pending.extend_from_slice(text.as_bytes()),
            _ => self.pending.extend_from_slice(tokenizer.piece_bytes(id)),
        }
        if self.strip_leading_space && !self.pending.is_empty() {
            if self.pending[0] == b' ' {
                self.pending.remove(0);
            }
            self.strip_leading_space = false;
        }
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(&String::from_utf8_lossy(&self.pending[..valid]));
                    match e.error_len() {
                        // An incomplete character at the end: wait for the next token.
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        // Bytes that can never become valid: U+FFFD, as every decoder does.
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// What is left at the end (an incomplete character becomes U+FFFD).
    pub fn flush(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}
