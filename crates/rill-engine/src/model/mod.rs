//! Loading a model file: GGUF header checks, architecture dispatch, weights, tokenizer and
//! chat template, all at once, so that a bad file fails here with a clear message instead of
//! halfway through an answer.
//!
//! One file per architecture family lives beside this one; today that is [`llama`], which
//! covers every `general.architecture = "llama"` file (Llama 2/3, SmolLM, TinyLlama, and
//! Mistral as llama.cpp converts it) and `"mistral"`.

pub mod attention;
pub mod llama;
mod ops;

use std::fs::File;
use std::io::{BufReader, Read, Seek};
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file;
use candle_core::Device;
use serde::Serialize;

use crate::error::{candle_message, Error, Result};
use crate::template::ChatTemplate;
use crate::tokenizer::Tokenizer;
pub use llama::{KvCache, Llama};

/// Architectures the llama forward pass runs.
const LLAMA_FAMILY: &[&str] = &["llama", "mistral"];

/// What a model file is, read from its header (cheap: no weights are loaded).
#[derive(Clone, Debug, Serialize)]
pub struct ModelInfo {
    pub path: PathBuf,
    pub name: String,
    pub architecture: String,
    /// The storage type of most weights (Q4_1, Q8_0, F16, …).
    pub quantization: String,
    pub parameters: u64,
    pub file_bytes: u64,
    /// Trained context length.
    pub context_length: usize,
    pub has_chat_template: bool,
}

/// Everything the engine needs from a model file.
pub struct Model {
    pub info: ModelInfo,
    pub weights: Llama,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
}

fn open(path: &Path) -> Result<(File, u64)> {
    let file = File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::model_file(path, "no such file"),
        _ => Error::model_file(path, e.to_string()),
    })?;
    let meta = file
        .metadata()
        .map_err(|e| Error::model_file(path, e.to_string()))?;
    if meta.is_dir() {
        return Err(Error::model_file(path, "is a directory, not a GGUF file"));
    }
    Ok((file, meta.len()))
}

/// Reads and checks the header: magic, metadata, tensor table, and that every tensor's data
/// lies inside the file (a truncated download is caught here, not when the tensor is read).
fn read_header(path: &Path) -> Result<(gguf_file::Content, BufReader<File>, u64)> {
    let (file, len) = open(path)?;
    let mut reader = BufReader::new(file);
    let mut magic = [0u8; 4];
    if reader.read_exact(&mut magic).is_err() || &magic != b"GGUF" {
        return Err(Error::model_file(path, "not a GGUF file (Rill loads .gguf models; convert others with llama.cpp's convert_hf_to_gguf.py)"));
    }
    reader.rewind()?;
    let content = gguf_file::Content::read(&mut reader).map_err(|e| {
        Error::model_file(
            path,
            format!(
                "damaged GGUF header (truncated or corrupt file?): {}",
                candle_message(&e)
            ),
        )
    })?;
    let needed = content
        .tensor_infos
        .values()
        .map(|t| {
            let bytes = t.shape.elem_count() / t.ggml_dtype.block_size() * t.ggml_dtype.type_size();
            content.tensor_data_offset + t.offset + bytes as u64
        })
        .max()
        .unwrap_or(0);
    if needed > len {
        return Err(Error::model_file(
            path,
            format!("truncated: its tensors need {needed} bytes but the file has {len} (incomplete download?)"),
        ));
    }
    Ok((content, reader, len))
}

fn info_of(path: &Path, content: &gguf_file::Content, len: u64) -> Result<ModelInfo> {
    let md = &content.metadata;
    let s = |k: &str| md.get(k).and_then(|v| v.to_string().ok()).cloned();
    let architecture = s("general.architecture")
        .ok_or_else(|| Error::model_file(path, "no `general.architecture` in the metadata"))?;
    let name = s("general.name").unwrap_or_else(|| {
        path.file_stem()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    });
    // The most common type among 2-D weights names the quantisation (norms are always F32).
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    for t in content
        .tensor_infos
        .values()
        .filter(|t| t.shape.rank() == 2)
    {
        *counts.entry(format!("{:?}", t.ggml_dtype)).or_default() += 1;
    }
    let quantization = counts
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .map(|(q, _)| q)
        .unwrap_or_default();
    let parameters = content
        .tensor_infos
        .values()
        .map(|t| t.shape.elem_count() as u64)
        .sum();
    let context_length = md
        .get(&format!("{architecture}.context_length"))
        .and_then(|v| v.to_u32().ok())
        .unwrap_or(4096) as usize;
    Ok(ModelInfo {
        path: path.to_owned(),
        name,
        architecture,
        quantization,
        parameters,
        file_bytes: len,
        context_length,
        has_chat_template: md.contains_key("tokenizer.chat_template"),
    })
}

/// Describes a model file without loading its weights.
pub fn inspect(path: &Path) -> Result<ModelInfo> {
    let (content, _, len) = read_header(path)?;
    info_of(path, &content, len)
}

impl Model {
    /// Loads a GGUF model onto `device`. `context_cap` limits the context (and so the memory a
    /// sequence can take); `None` keeps the trained length.
    pub fn load(path: &Path, device: &Device, context_cap: Option<usize>) -> Result<Model> {
        let (content, mut reader, len) = read_header(path)?;
        let info = info_of(path, &content, len)?;
        if !LLAMA_FAMILY.contains(&info.architecture.as_str()) {
            return Err(Error::UnsupportedArchitecture(info.architecture));
        }
        let tokenizer = Tokenizer::from_gguf(&content.metadata, path.parent())?;
        let special =
            |id: Option<u32>| id.and_then(|i| tokenizer.token_text(i)).unwrap_or_default();
        let template_src = content
            .metadata
            .get("tokenizer.chat_template")
            .and_then(|v| v.to_string().ok());
        let template = ChatTemplate::new(
            template_src.map(String::as_str),
            special(tokenizer.bos_id()),
            special(tokenizer.eos_id()),
        )?;
        let weights = Llama::from_gguf(
            &content,
            &mut reader,
            device,
            &info.architecture,
            context_cap,
            path,
        )?;
        let vocab = weights_vocab(&content);
        if vocab.is_some_and(|v| v != tokenizer.vocab_size()) {
            return Err(Error::model_file(
                path,
                format!(
                    "the tokenizer has {} tokens but the embedding has {} rows",
                    tokenizer.vocab_size(),
                    vocab.unwrap_or(0)
                ),
            ));
        }
        tracing::info!(name = %info.name, quant = %info.quantization, ctx = weights.config().context_length, "model loaded");
        Ok(Model {
            info,
            weights,
            tokenizer,
            template,
        })
    }
}

fn weights_vocab(content: &gguf_file::Content) -> Option<usize> {
    content
        .tensor_infos
        .get("token_embd.weight")
        .map(|t| t.shape.dims()[0])
}
