//! Loading a model file: GGUF header checks, architecture dispatch, weights, tokenizer and
//! chat template, all at once, so that a bad file fails here with a clear message instead of
//! halfway through an answer.
//!
//! One block ([`decoder`]) runs every family; [`family`] describes how each differs from llama's
//! (RoPE pairing, q/k/v biases, q/k norms, a mixture of experts, …): llama and mistral (Llama
//! 2/3, SmolLM, TinyLlama, Mistral), qwen2 (Qwen2/2.5, DeepSeek-R1-Distill-Qwen), qwen3 and
//! qwen3moe (Qwen3-30B-A3B, [`experts`]), gemma2, gemma3, phi3, gpt-oss, and qwen35 (Qwen3.5,
//! whose Gated DeltaNet layers keep a recurrent state per sequence: `delta.rs`, `recurrent.rs`).

pub mod attention;
mod backend;
mod config;
pub mod decoder;
mod delta;
mod device;
pub mod experts;
pub mod family;
mod heads;
mod hybrid;
mod inject;
pub use crate::gguf;
mod host;
mod kv;
pub mod kv_rows;
mod load;
pub(crate) mod ops;
mod parts;
mod positions;
mod recurrent;
mod resident;
mod table;
pub(crate) mod tensors;
mod workspace;

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use candle_core::Device;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::template::ChatTemplate;
use crate::tokenizer::Tokenizer;
pub use decoder::{Decoder, KvCache};
pub use kv::KV_ROLLBACK;
pub use kv_rows::KvType;
pub(crate) use resident::lock_weights;
pub use resident::LockRefused;

/// What a model file is, read from its header (cheap: no weights are loaded).
#[derive(Clone, Debug, Serialize)]
pub struct ModelInfo {
    pub path: PathBuf,
    pub name: String,
    pub architecture: String,
    /// The family for people ("Qwen3", "Gemma 3"), or what the file is when Rill does not run
    /// it ("gpt-oss (not run: gpt-oss, a mixture of experts with MXFP4 weights, not run yet)").
    pub family: String,
    /// Whether Rill runs this architecture.
    pub runs: bool,
    /// The storage type of most weights (Q4_1, Q8_0, F16, …).
    pub quantization: String,
    pub parameters: u64,
    pub file_bytes: u64,
    /// Trained context length.
    pub context_length: usize,
    pub has_chat_template: bool,
    /// How its chat template lets it think (a Think switch, always, or not at all): known once
    /// the model is loaded, since finding it out runs the template, which listing never does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking: Option<crate::template::Thinking>,
}

impl ModelInfo {
    /// What a listing says of a file it cannot read: its name and size, and that it does not run.
    pub fn unreadable(path: &Path) -> ModelInfo {
        ModelInfo {
            path: path.to_owned(),
            name: path
                .file_stem()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            architecture: String::new(),
            family: "unreadable".into(),
            runs: false,
            quantization: String::new(),
            parameters: 0,
            file_bytes: std::fs::metadata(path).map_or(0, |m| m.len()),
            context_length: 0,
            has_chat_template: false,
            thinking: None,
        }
    }
}

/// Everything the engine needs from a model file.
pub struct Model {
    pub info: ModelInfo,
    pub weights: Decoder,
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
/// Every number in it is checked before use ([`gguf`]), so a crafted file is an error here.
/// With `summary`, metadata arrays are checked but not held ([`gguf::read_summary`]).
pub(crate) fn read_header(
    path: &Path,
    summary: bool,
) -> Result<(gguf::Header, BufReader<File>, u64)> {
    let (file, len) = open(path)?;
    let mut reader = BufReader::new(file);
    let mut magic = [0u8; 4];
    if reader.read_exact(&mut magic).is_err() || &magic != b"GGUF" {
        return Err(Error::model_file(path, "not a GGUF file (Rill loads .gguf models; convert others with llama.cpp's convert_hf_to_gguf.py)"));
    }
    let content = match summary {
        true => gguf::read_summary(&mut reader, len),
        false => gguf::read(&mut reader, len),
    }
    .map_err(|e| header_error(path, e))?;
    Ok((content, reader, len))
}

fn header_error(path: &Path, e: gguf::HeaderError) -> Error {
    match e {
        gguf::HeaderError::Damaged(m) if m.starts_with("truncated:") => Error::model_file(path, m),
        gguf::HeaderError::Damaged(m) => Error::model_file(
            path,
            format!("damaged GGUF header (truncated or corrupt file?): {m}"),
        ),
        unsupported => Error::model_file(path, unsupported.to_string()),
    }
}

fn info_of(path: &Path, content: &gguf::Header, len: u64) -> Result<ModelInfo> {
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
        *counts.entry(t.dtype.name()).or_default() += 1;
    }
    let quantization = counts
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .map(|(q, _)| q)
        .unwrap_or_default();
    let parameters = content
        .tensor_infos
        .values()
        .fold(0u64, |n, t| n.saturating_add(t.shape.elem_count() as u64));
    let context_length = md
        .get(&format!("{architecture}.context_length"))
        .and_then(|v| v.to_u32().ok())
        .unwrap_or(4096) as usize;
    Ok(ModelInfo {
        path: path.to_owned(),
        name,
        family: family::label(&architecture),
        runs: family::of(&architecture).is_some(),
        architecture,
        quantization,
        parameters,
        file_bytes: len,
        context_length,
        has_chat_template: md.contains_key("tokenizer.chat_template"),
        thinking: None,
    })
}

/// The file's chat template, compiled (never rendered: listing runs no template code).
fn template_source(content: &gguf::Header) -> Option<&str> {
    content
        .metadata
        .get("tokenizer.chat_template")
        .and_then(|v| v.to_string().ok())
        .map(String::as_str)
}

/// A template failure as the model's error: the file is fine, its template is not (issue 40).
fn template_error(path: &Path, e: Error) -> Error {
    let why = match e {
        Error::Template(m) | Error::TemplateLimit(m) => m,
        other => other.to_string(),
    };
    Error::model_file(path, format!("its chat template fails: {why}"))
}

/// Describes a model file without loading its weights. Its chat template is compiled, so a
/// broken one is named here, but not run.
pub fn inspect(path: &Path) -> Result<ModelInfo> {
    let (content, _, len) = read_header(path, true)?;
    let info = info_of(path, &content, len)?;
    ChatTemplate::new(template_source(&content), "", "").map_err(|e| template_error(path, e))?;
    Ok(info)
}

/// The text side of a model: its tokenizer and chat template.
struct TextSide {
    tokenizer: Tokenizer,
    template: ChatTemplate,
    thinking: crate::template::Thinking,
}

/// Everything checked before the weights are read: the architecture, the hyper-parameters
/// against every tensor's shape, the tokenizer against the embedding, the chat template.
fn check_content(
    path: &Path,
    content: &gguf::Header,
    info: &ModelInfo,
    beside: Option<&Path>,
) -> Result<TextSide> {
    let Some(family) = family::of(&info.architecture) else {
        return Err(family::unsupported(&info.architecture));
    };
    decoder::DecoderConfig::read(content, family, Some(1), path)?;
    let tokenizer = Tokenizer::from_gguf(&content.metadata, beside)?;
    let vocab = weights_vocab(content);
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
    let special = |id: Option<u32>| id.and_then(|i| tokenizer.token_text(i)).unwrap_or_default();
    let template = ChatTemplate::new(
        template_source(content),
        special(tokenizer.bos_id()),
        special(tokenizer.eos_id()),
    )
    .map_err(|e| template_error(path, e))?;
    // One question, rendered as a chat would be: a template that runs into a limit on it (a
    // loop without end, a value that holds itself) or crashes fails here, naming the model, not
    // at the first message. One that refuses the question (some need a system message, or
    // variables a client passes) is a template doing its job, and loads. It is how the
    // template thinks that this learns.
    if let Err(e @ Error::TemplateLimit(_)) =
        template.render(&[crate::template::Message::user("2 + 2?")], true)
    {
        return Err(template_error(path, e));
    }
    let thinking = template.thinking();
    Ok(TextSide {
        tokenizer,
        template,
        thinking,
    })
}

/// Runs every check [`Model::load`] makes besides reading the weights on a GGUF file held in
/// `reader` (`len` bytes; `path` only names it in errors). For tests that feed the loader
/// crafted and mutated headers: whatever the bytes, this returns, never panics.
pub fn check<R: std::io::Read + std::io::Seek>(
    reader: &mut R,
    len: u64,
    path: &Path,
) -> Result<ModelInfo> {
    let content = gguf::read(reader, len).map_err(|e| header_error(path, e))?;
    let mut info = info_of(path, &content, len)?;
    info.thinking = Some(check_content(path, &content, &info, None)?.thinking);
    Ok(info)
}

/// Which code runs a CPU model's forward pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Compute {
    /// Rill's own: plain buffers, its SIMD kernels and attention (the default on the CPU).
    #[default]
    Ours,
    /// candle's tensors, as on a GPU: run on candle's CPU device, it tests that path against
    /// ours where no GPU is.
    Candle,
}

impl Model {
    /// Loads a GGUF model onto `device`. `context_cap` limits the context (and so the memory a
    /// sequence can take); `None` keeps the trained length.
    pub fn load(path: &Path, device: &Device, context_cap: Option<usize>) -> Result<Model> {
        Self::load_with(path, device, context_cap, Compute::Ours)
    }

    /// [`load`](Self::load), choosing which code runs the forward pass on the CPU.
    pub fn load_with(
        path: &Path,
        device: &Device,
        context_cap: Option<usize>,
        compute: Compute,
    ) -> Result<Model> {
        let (content, mut reader, len) = read_header(path, false)?;
        let mut info = info_of(path, &content, len)?;
        let family = family::of(&info.architecture)
            .ok_or_else(|| family::unsupported(&info.architecture))?;
        // On Unix the weights come from a map of the file: our kernels' panels are made from
        // its bytes, and what candle runs is copied out of it (elsewhere, or where mapping
        // fails, the file is read); each copied tensor's pages leave the map once it is made.
        // MXFP4 matrices (gpt-oss's experts) are not copied: they are read in the map, which
        // lives as long as they do (`kernels/mapped.rs`).
        #[cfg(unix)]
        // SAFETY: the map is only read. A file another program shrinks while the model is
        // loaded could fault (SIGBUS), as with any mapped model file (llama.cpp's too); one it
        // rewrites gives wrong weights, as a read would.
        let map = unsafe { memmap2::Mmap::map(reader.get_ref()) }
            .ok()
            .map(std::sync::Arc::new);
        #[cfg(not(unix))]
        let map: Option<std::sync::Arc<memmap2::Mmap>> = None;
        // The tokenizer (a BPE of up to 280,000 merges) is built beside the weights.
        let (text, weights) = std::thread::scope(|s| {
            let text = s.spawn(|| check_content(path, &content, &info, path.parent()));
            let source = match &map {
                Some(map) => tensors::TensorSource::Mapped(map),
                None => tensors::TensorSource::Read(&mut reader),
            };
            let weights =
                Decoder::from_gguf(&content, source, device, family, context_cap, path, compute);
            let text = text
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (text, weights)
        });
        drop(map);
        let TextSide {
            tokenizer,
            template,
            thinking,
        } = text?;
        info.thinking = Some(thinking);
        let weights = weights?;
        tracing::info!(name = %info.name, quant = %info.quantization, ctx = weights.config().context_length, "model loaded");
        Ok(Model {
            info,
            weights,
            tokenizer,
            template,
        })
    }
}

fn weights_vocab(content: &gguf::Header) -> Option<usize> {
    content
        .tensor_infos
        .get("token_embd.weight")
        .and_then(|t| t.shape.dims().first().copied())
}
