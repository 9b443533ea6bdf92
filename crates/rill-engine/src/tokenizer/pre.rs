//! Pre-tokenizers: how text is split before BPE, for each `tokenizer.ggml.pre` llama.cpp
//! knows (its `llm_tokenizer_bpe`, llama-vocab.cpp). A split changes ids (SmolLM2 splits every
//! digit, Llama 3 groups them by three), so each name gets llama.cpp's regexes, applied in turn
//! as HF `tokenizers` Split steps, then GPT-2's byte-level map. Parity with llama.cpp's own test
//! vocabularies is tested (`tests/tokenizers.rs`).

use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::SplitDelimiterBehavior;

use crate::error::{Error, Result};

// Pre-tokenizer regexes, as llama.cpp's `llm_tokenizer_bpe` applies them (llama-vocab.cpp):
// each splits the pieces the one before left, keeping what it matches as pieces of their own.
const GPT2_REGEX: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen 3.5's: combining marks (`\p{M}`) belong to the letters they follow.
const QWEN35_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// o200k (GPT-4o's, gpt-oss's `o200k_harmony`, Llama 4's): words split before capitals,
/// contractions kept, digits by three, punctuation with trailing newlines and slashes.
const GPT4O_REGEX: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// DeepSeek Coder: newlines, letters, punctuation, CJK and each digit on their own.
const DEEPSEEK_CODER_REGEXES: &[&str] = &[
    r"[\r\n]",
    r"\s?\p{L}+",
    r"\s?\p{P}+",
    r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+",
    r"\p{N}",
];
/// DeepSeek LLM: as llama.cpp writes it, with its explicit table of Latin, Greek, Cyrillic, …
/// letters (as code points: some are canonical singletons, which an editor normalising the
/// text would change, and the class with them).
const DEEPSEEK_LLM_REGEXES: &[&str] = &[
    r"[\r\n]",
    r"\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+",
    r"\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+",
    r"\s+$",
    r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+",
    r"\p{N}+",
];

/// Falcon: punctuation runs, GPT-2's split, then digits in threes.
const FALCON_REGEXES: &[&str] = &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2_REGEX, r"[0-9][0-9][0-9]"];

/// What a `tokenizer.ggml.pre` name means in llama.cpp: how text is split, whether a word
/// found whole in the vocabulary skips the merges (`ignore_merges`), and whether a BOS is added
/// when the file has no `tokenizer.ggml.add_bos_token` (llama.cpp's defaults for that name).
pub(super) struct Pre {
    pub tokenizer: PreTokenizerWrapper,
    pub ignore_merges: bool,
    pub add_bos: bool,
}

/// The pre-tokenizer llama.cpp uses for a `tokenizer.ggml.pre` name.
pub(super) fn pre_tokenizer_for(pre: &str) -> Result<Pre> {
    let split = |regex: &str| -> Result<PreTokenizerWrapper> {
        let s = Split::new(
            SplitPattern::Regex(regex.into()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| Error::Tokenizer(format!("pre-tokenizer regex `{regex}`: {e}")))?;
        Ok(s.into())
    };
    let byte_level = |use_regex| PreTokenizerWrapper::from(ByteLevel::new(false, false, use_regex));
    let splits = |regexes: &[&str]| -> Result<PreTokenizerWrapper> {
        let mut steps = regexes
            .iter()
            .map(|r| split(r))
            .collect::<Result<Vec<_>>>()?;
        steps.push(byte_level(false));
        Ok(Sequence::new(steps).into())
    };
    let plain = |tokenizer| Pre {
        tokenizer,
        ignore_merges: false,
        add_bos: false,
    };
    Ok(match pre {
        "default" | "gpt-2" | "gpt2" | "mpt" | "olmo" | "jais" | "trillion" | "" => {
            plain(byte_level(true))
        }
        "smollm" => plain(Sequence::new(vec![Digits::new(true).into(), byte_level(true)]).into()),
        // Each digit alone, then GPT-2's split.
        "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva" => {
            plain(splits(&[r"\p{N}", GPT2_REGEX])?)
        }
        // Llama 3's vocabulary looks whole words up first, and starts with BOS.
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" | "dbrx" | "smaug-bpe" => Pre {
            tokenizer: splits(&[LLAMA3_REGEX])?,
            ignore_merges: matches!(
                pre,
                "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral"
            ),
            add_bos: matches!(
                pre,
                "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral"
            ),
        },
        "qwen2" | "deepseek-r1-qwen" | "stablelm2" | "hunyuan" => plain(splits(&[QWEN2_REGEX])?),
        "qwen35" => plain(splits(&[QWEN35_REGEX])?),
        "gpt-4o" | "llama4" => plain(splits(&[GPT4O_REGEX])?),
        "deepseek-coder" => plain(splits(DEEPSEEK_CODER_REGEXES)?),
        "deepseek-llm" => plain(splits(DEEPSEEK_LLM_REGEXES)?),
        "falcon" => plain(splits(FALCON_REGEXES)?),
        other => {
            tracing::warn!(
                pre = other,
                "unknown tokenizer.ggml.pre; using the GPT-2 pre-tokenizer"
            );
            plain(byte_level(true))
        }
    })
}

/// Gemma 4's split: lines and runs of newlines apart; BPE then runs on raw UTF-8 (no byte-level
/// map), spaces having become `▁`.
pub(super) fn gemma4() -> Result<PreTokenizerWrapper> {
    let s = Split::new(
        SplitPattern::Regex(r"[^\n]+|[\n]+".into()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| Error::Tokenizer(format!("pre-tokenizer: {e}")))?;
    Ok(s.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    /// o200k's split (no vocabulary of it in llama.cpp's assets): the pieces Python's `regex`
    /// gives for the pattern of its `tokenizer.json`, which fancy-regex must give too.
    #[test]
    fn o200k_splits_text_as_its_regex_does() {
        let split = Split::new(
            SplitPattern::Regex(GPT4O_REGEX.into()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .unwrap();
        let text = "Hello World's HTTPServer ran 1234567 times!\n\n  path/to/file.rs  DON'T stop, \
                    café naïve 日本語";
        let mut pre = PreTokenizedString::from(text);
        split.pre_tokenize(&mut pre).unwrap();
        let pieces: Vec<&str> = pre
            .get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(p, _, _)| p)
            .collect();
        // regex.findall(pattern, text), Python 3.11, regex 2026.5.9.
        let want = [
            "Hello",
            " World's",
            " HTTPServer",
            " ran",
            " ",
            "123",
            "456",
            "7",
            " times",
            "!\n\n",
            " ",
            " path",
            "/to",
            "/file",
            ".rs",
            " ",
            " DON'T",
            " stop",
            ",",
            " café",
            " naïve",
            " 日本語",
        ];
        assert_eq!(pieces, want);
    }
}
