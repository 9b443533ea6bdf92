//! `rill tokenize`: a prompt's token ids and pieces, as the engine will run them, for users who
//! debug prompts and for tests (llama.cpp's `llama-tokenize` prints the same).
//!
//! Only the model's header is read (its tokenizer), not its weights: it answers at once, and
//! also for a file whose architecture Rill does not run yet.

use std::io::Read;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use rill_engine::tokenizer::Tokenizer;
use serde_json::json;

#[derive(Args)]
pub struct TokenizeArgs {
    /// Path to a GGUF model file.
    #[arg(long, env = "RILL_MODEL")]
    model: Option<PathBuf>,
    /// The text to tokenize (default: stdin).
    #[arg(long)]
    text: Option<String>,
    /// Leave out the BOS the model would add (llama-tokenize's `--no-bos`).
    #[arg(long)]
    no_bos: bool,
    /// One JSON object: `{"ids": […], "pieces": […]}`.
    #[arg(long)]
    json: bool,
}

pub fn tokenize(a: TokenizeArgs) -> Result<()> {
    let model = a
        .model
        .context("no model: pass --model PATH or set RILL_MODEL")?;
    let tok = Tokenizer::from_file(&model)?;
    let text = match a.text {
        Some(t) => t,
        None => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("reading stdin")?;
            s
        }
    };
    let ids = tok.encode_with(&text, !a.no_bos)?;
    // A control token stands for no text: it is shown by its name (`<|im_start|>`).
    let pieces: Vec<String> = ids
        .iter()
        .map(|&id| match tok.piece_bytes(id) {
            [] => tok.token_text(id).unwrap_or_default(),
            bytes => String::from_utf8_lossy(bytes).into_owned(),
        })
        .collect();
    if a.json {
        println!("{}", json!({"ids": ids, "pieces": pieces}));
    } else {
        for (id, piece) in ids.iter().zip(&pieces) {
            println!("{id:>6} -> '{piece}'");
        }
    }
    Ok(())
}
