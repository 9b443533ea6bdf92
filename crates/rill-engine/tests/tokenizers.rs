//! Tokenizer parity with llama.cpp on its own test vocabularies (issue 14): every case of each
//! `ggml-vocab-*.gguf.inp` must give exactly the ids of its `.out`, as llama.cpp's
//! `test-tokenizer-0` computes them (no BOS, control tokens not parsed). The files come from
//! llama-cpp-python's sdist (`scripts/fetch-llama-cpp-assets.sh`, which `make test` runs).

mod common;

use std::path::PathBuf;

use rill_engine::tokenizer::{StreamDecoder, Tokenizer};

fn assets() -> PathBuf {
    common::llama_cpp_assets()
}

/// The test strings of a vocabulary and the ids llama.cpp gives each.
fn cases(vocab: &str) -> Vec<(String, Vec<u32>)> {
    let dir = assets();
    let inp = std::fs::read_to_string(dir.join(format!("ggml-vocab-{vocab}.gguf.inp"))).unwrap();
    let out = std::fs::read_to_string(dir.join(format!("ggml-vocab-{vocab}.gguf.out"))).unwrap();
    let mut texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    // Most files end with a separator; gemma-4's does not.
    if texts.last() == Some(&"") {
        texts.pop();
    }
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(
        texts.len(),
        ids.len(),
        "{vocab}: as many test strings as id lines"
    );
    texts.into_iter().map(str::to_owned).zip(ids).collect()
}

/// How many cases of `vocab` Rill tokenizes as llama.cpp does, and the first few that differ.
fn parity(vocab: &str) -> (usize, usize, Vec<String>) {
    let tok = match Tokenizer::from_file(&assets().join(format!("ggml-vocab-{vocab}.gguf"))) {
        Ok(t) => t,
        Err(e) => return (0, 0, vec![e.to_string()]),
    };
    let cases = cases(vocab);
    let mut wrong = Vec::new();
    for (text, want) in &cases {
        let got = tok.encode_with(text, false).unwrap();
        if &got != want {
            wrong.push(format!("{text:?}: got {got:?}, llama.cpp {want:?}"));
        }
    }
    (cases.len() - wrong.len(), cases.len(), wrong)
}

/// Every tokenizer of llama.cpp's test set that Rill claims: BPE with each pre-tokenizer,
/// SentencePiece (llama-spm, phi-3) and Gemma 4's own. Not claimed: `bert-bge` (WordPiece, an
/// embedding model's) is refused clearly (see below).
const CLAIMED: &[&str] = &[
    "command-r",
    "deepseek-coder",
    "deepseek-llm",
    "falcon",
    "gemma-4",
    "gpt-2",
    "llama-bpe",
    "llama-spm",
    "mpt",
    "phi-3",
    "qwen2",
    "qwen35",
    "refact",
    "starcoder",
];

#[test]
fn every_claimed_vocabulary_tokenizes_exactly_like_llama_cpp() {
    let mut failed = Vec::new();
    for v in CLAIMED {
        let (ok, n, wrong) = parity(v);
        eprintln!("{v}: {ok} of {n} cases");
        if ok != n || n == 0 {
            failed.push(format!("{v}: {ok}/{n}\n    {}", wrong.join("\n    ")));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
fn a_tokenizer_rill_does_not_run_is_a_clear_error() {
    let err = Tokenizer::from_file(&assets().join("ggml-vocab-bert-bge.gguf")).unwrap_err();
    assert!(
        err.to_string()
            .contains("unsupported tokenizer model `bert`"),
        "{err}"
    );
}

/// Issue 14: where the file has no `tokenizer.ggml.add_bos_token`, llama.cpp's default for its
/// tokenizer decides: Llama 3's BPE and SentencePiece start with BOS, GPT-2's and Qwen's do not.
/// (Rill added none to a Llama-3 file without the key.)
#[test]
fn without_add_bos_token_a_bos_is_added_as_llama_cpp_defaults_say() {
    let dir = tempfile::tempdir().unwrap();
    for (vocab, bos_first) in [
        ("llama-bpe", true),
        ("llama-spm", true),
        ("qwen2", false),
        ("gpt-2", false),
    ] {
        let mut craft =
            common::gguf_craft::read(&assets().join(format!("ggml-vocab-{vocab}.gguf")));
        craft
            .metadata
            .retain(|(k, _)| k != "tokenizer.ggml.add_bos_token");
        let path = dir.path().join(format!("{vocab}.gguf"));
        std::fs::write(&path, craft.bytes()).unwrap();
        let tok = Tokenizer::from_file(&path).unwrap();
        let ids = tok.encode_with("Hello world", true).unwrap();
        let starts = tok.bos_id().is_some() && ids.first() == tok.bos_id().as_ref();
        assert_eq!(
            starts,
            bos_first,
            "{vocab}: {ids:?} (BOS {:?})",
            tok.bos_id()
        );
        // Without `add_special`, never.
        let plain = tok.encode_with("Hello world", false).unwrap();
        assert!(
            plain.first() != tok.bos_id().as_ref() || tok.bos_id().is_none(),
            "{vocab}"
        );
    }
}

/// Issue 14: a SentencePiece token that continues text keeps its leading space ("and then" +
/// " Pays"), as llama.cpp streams it; a new answer drops the space the tokenizer put first.
#[test]
fn a_sentencepiece_continuation_keeps_the_space_of_its_first_token() {
    let tok = Tokenizer::from_file(&assets().join("ggml-vocab-llama-spm.gguf")).unwrap();
    let ids = tok.encode_with("Pays", false).unwrap(); // "▁Pays": the prefix space is in it
    let text = |mut d: StreamDecoder| {
        let mut s: String = ids.iter().map(|&id| d.push(&tok, id)).collect();
        s.push_str(&d.flush());
        s
    };
    assert_eq!(text(StreamDecoder::continuing()), " Pays");
    assert_eq!(text(StreamDecoder::new(&tok)), "Pays");
}
