//! Images in a prompt: the engine's [`Vision`] (a projector paired with the text model, the
//! tokens that open and close an image in the prompt, and the rows of recent images kept), and
//! where each image's rows go ([`PromptImage`]).
//!
//! A prompt holds an image as `begin` tokens, one placeholder per row (the image's
//! [`placeholder`](crate::message::ImageData::placeholder) id), and `end` tokens, as llama.cpp's
//! `mtmd_tokenize` lays it out (for Gemma 3: `<start_of_image>`, 256 rows, `<end_of_image>`).
//! The rows of the last few images are kept, so a follow-up question about the same picture
//! does not encode it again.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::{ImageRows, Picture, Projector, ProjectorKind};
use crate::error::{Error, Result};
use crate::message::{ImageData, IMAGE_PLACEHOLDER};
use crate::tokenizer::Tokenizer;

/// Images whose rows are kept (a 4B Gemma 3's are 2.6 MB each).
const KEPT: usize = 8;

/// A projector paired with the text model.
pub struct Vision {
    projector: Projector,
    begin: Vec<u32>,
    end: Vec<u32>,
    kept: Mutex<VecDeque<ImageRows>>,
    /// Whether an image's rows attend to each other both ways.
    both_ways: bool,
    /// Images encoded so far (kept ones reused are not counted).
    encoded: AtomicUsize,
}

/// One image of a prompt: its rows, and the position of the first.
#[derive(Clone, Debug)]
pub struct PromptImage {
    pub at: usize,
    pub rows: ImageRows,
    /// Whether its rows attend to each other both ways (Gemma 3's do in llama.cpp).
    pub both_ways: bool,
}

impl ProjectorKind {
    /// The text around an image's rows in the prompt (llama.cpp's `img_beg`, `img_end`).
    fn markers(self) -> (&'static str, &'static str) {
        match self {
            ProjectorKind::Gemma3 => ("<start_of_image>", "<end_of_image>"),
            ProjectorKind::Qwen25Vl | ProjectorKind::Qwen2Vl | ProjectorKind::Qwen3Vl => {
                ("<|vision_start|>", "<|vision_end|>")
            }
            ProjectorKind::Gemma4 => ("<|image>", "<image|>"),
        }
    }

    /// Whether an image's rows attend to each other both ways in a text model `hidden` wide,
    /// as llama.cpp runs them (`mtmd_decode_use_non_causal`).
    fn both_ways(self, hidden: usize) -> bool {
        match self {
            ProjectorKind::Gemma3 => true,
            // Gemma 4 E2B and E4B (1,536 and 2,560 wide) read theirs causally, the others
            // both ways.
            ProjectorKind::Gemma4 => hidden != 1536 && hidden != 2560,
            // Qwen-VL's image rows are causal in the text model, as llama.cpp runs them.
            ProjectorKind::Qwen25Vl | ProjectorKind::Qwen2Vl | ProjectorKind::Qwen3Vl => false,
        }
    }
}

impl Vision {
    /// Pairs `projector` with a text model `hidden` wide, with `deepstack` layers that read
    /// image rows (Qwen3-VL), and its tokenizer.
    pub fn new(
        projector: Projector,
        tokenizer: &Tokenizer,
        hidden: usize,
        deepstack: usize,
    ) -> Result<Vision> {
        if projector.text_width() != hidden {
            return Err(Error::model_file(
                projector.path(),
                format!(
                    "vision projector: it makes rows {} wide, and the model's are {hidden}: \
                     it belongs to another model",
                    projector.text_width()
                ),
            ));
        }
        if projector.deepstack() != deepstack {
            return Err(Error::model_file(
                projector.path(),
                format!(
                    "vision projector: it gives {} deepstack rows, and the model reads {deepstack}: \
                     it belongs to another model",
                    projector.deepstack()
                ),
            ));
        }
        let (begin, end) = projector.config().kind.markers();
        Ok(Vision {
            both_ways: projector.config().kind.both_ways(hidden),
            begin: tokenizer.encode_with(begin, false)?,
            end: tokenizer.encode_with(end, false)?,
            projector,
            kept: Mutex::new(VecDeque::new()),
            encoded: AtomicUsize::new(0),
        })
    }

    pub fn projector(&self) -> &Projector {
        &self.projector
    }

    /// The tokens before and after an image's rows.
    pub fn markers(&self) -> (&[u32], &[u32]) {
        (&self.begin, &self.end)
    }

    /// Images encoded so far; a kept image's rows reused are not counted.
    pub fn encoded(&self) -> usize {
        self.encoded.load(Ordering::Relaxed)
    }

    /// The rows `image` becomes (from its header's size where the encoder keeps the
    /// image's shape).
    pub fn rows_for(&self, image: &ImageData) -> Result<usize> {
        let (w, h) = match self.projector.config().dynamic_size() {
            true => Picture::dimensions(image.bytes()).map_err(|e| Error::Image(e.to_string()))?,
            false => (0, 0),
        };
        let (nx, ny) = self.projector.grid(w, h);
        Ok(nx * ny)
    }

    /// The image's rows: kept ones when it was seen lately, else decoded and encoded.
    pub fn encode(&self, image: &ImageData) -> Result<ImageRows> {
        let id = image.id();
        if let Some(rows) = self.kept_rows(id) {
            return Ok(rows);
        }
        let picture = Picture::decode(image.bytes()).map_err(|e| Error::Image(e.to_string()))?;
        let rows = self.projector.encode(&picture)?;
        self.encoded.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(id = format!("{id:016x}"), rows = rows.rows, "image encoded");
        if let Ok(mut kept) = self.kept.lock() {
            kept.push_back(rows.clone());
            if kept.len() > KEPT {
                kept.pop_front();
            }
        }
        Ok(rows)
    }

    fn kept_rows(&self, id: u64) -> Option<ImageRows> {
        let mut kept = self.kept.lock().ok()?;
        let at = kept.iter().position(|r| r.id == id)?;
        // The most recent at the back.
        let rows = kept.remove(at)?;
        kept.push_back(rows.clone());
        Some(rows)
    }

    /// Every image of `prompt` (runs of placeholders), with its rows: each run is one of
    /// `images` by its placeholder id.
    pub fn place(&self, prompt: &[u32], images: &[&ImageData]) -> Result<Vec<PromptImage>> {
        let mut out = Vec::new();
        let mut i = 0;
        let wrong = || {
            Error::param(
                "prompt",
                "holds image placeholders that are not a whole image of its messages",
            )
        };
        while i < prompt.len() {
            let id = prompt[i];
            if id < IMAGE_PLACEHOLDER {
                i += 1;
                continue;
            }
            let image = images
                .iter()
                .find(|im| im.placeholder() == id)
                .ok_or_else(wrong)?;
            let n = self.rows_for(image)?;
            let run = prompt[i..].iter().take(n).take_while(|&&t| t == id).count();
            if run != n {
                return Err(wrong());
            }
            let rows = self.encode(image)?;
            if rows.rows != n {
                return Err(wrong());
            }
            out.push(PromptImage {
                at: i,
                rows,
                both_ways: self.both_ways,
            });
            i += n;
        }
        Ok(out)
    }
}

/// A model file's name up to its quantisation: "gemma-3-4b-it-Q4_K_M.gguf" → "gemma-3-4b-it".
fn base_name(model: &Path) -> Option<String> {
    let stem = model.file_stem()?.to_string_lossy().to_lowercase();
    Some(
        stem.rsplit_once(['-', '.'])
            .map_or(stem.as_str(), |(b, _)| b)
            .to_owned(),
    )
}

/// Whether a file is a vision projector by its name, as LM Studio's and llama.cpp's
/// downloads name them (`mmproj` in it): the models list shows it with its model, not as one.
pub fn is_projector(path: &Path) -> bool {
    let name = path.file_name().map(|n| n.to_string_lossy().to_lowercase());
    name.is_some_and(|n| n.contains("mmproj") && n.ends_with(".gguf"))
}

/// The projector file beside a model, as LM Studio and llama.cpp's downloads put it: a
/// `.gguf` whose name has `mmproj` in the model's folder. Where the folder holds one
/// projector and one model (in one or more quantisations, as a Hugging Face repository's
/// folder does), they pair; otherwise the projector must name the model (its name up to the
/// quantisation), and only one may. `None` where there is none, or no way to choose: a flat
/// folder of many models never lends one model's projector to the others.
pub fn beside(model: &Path) -> Option<PathBuf> {
    let dir = model.parent()?;
    let ggufs: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension()
                .is_some_and(|x| x.eq_ignore_ascii_case("gguf"))
        })
        .collect();
    let (mut found, models): (Vec<PathBuf>, Vec<PathBuf>) = ggufs
        .into_iter()
        .partition(|p| is_projector(p) && p != model);
    found.sort();
    let base = base_name(model)?;
    if found.len() == 1 && models.iter().all(|m| base_name(m).as_ref() == Some(&base)) {
        return found.pop();
    }
    let mut named = found.into_iter().filter(|p| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().to_lowercase().contains(&base))
    });
    match (named.next(), named.next()) {
        (Some(one), None) => Some(one),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder(names: &[&str]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for n in names {
            std::fs::write(dir.path().join(n), b"GGUF").unwrap();
        }
        dir
    }

    #[test]
    fn a_model_alone_in_its_folder_takes_the_projector_beside_it() {
        let dir = folder(&["gemma-3-4b-it-Q4_K_M.gguf", "mmproj-model-f16.gguf"]);
        let found = beside(&dir.path().join("gemma-3-4b-it-Q4_K_M.gguf"));
        assert_eq!(found, Some(dir.path().join("mmproj-model-f16.gguf")));
        assert!(is_projector(&dir.path().join("mmproj-model-f16.gguf")));
        assert!(!is_projector(&dir.path().join("gemma-3-4b-it-Q4_K_M.gguf")));
        // Another quantisation of the same model beside it (a Hugging Face repository's
        // folder): the projector is still theirs.
        std::fs::write(dir.path().join("gemma-3-4b-it-Q8_0.gguf"), b"GGUF").unwrap();
        let found = beside(&dir.path().join("gemma-3-4b-it-Q8_0.gguf"));
        assert_eq!(found, Some(dir.path().join("mmproj-model-f16.gguf")));
    }

    #[test]
    fn in_a_folder_of_many_models_a_projector_pairs_only_with_the_model_it_names() {
        let dir = folder(&[
            "gemma-3-4b-it-Q4_K_M.gguf",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "mmproj-gemma-3-4b-it-f16.gguf",
        ]);
        let gemma = beside(&dir.path().join("gemma-3-4b-it-Q4_K_M.gguf"));
        assert_eq!(
            gemma,
            Some(dir.path().join("mmproj-gemma-3-4b-it-f16.gguf"))
        );
        assert_eq!(
            beside(&dir.path().join("SmolLM2-135M-Instruct.Q4_1.gguf")),
            None
        );
        // Two that name the same model: no way to choose.
        std::fs::write(dir.path().join("gemma-3-4b-it-mmproj-bf16.gguf"), b"GGUF").unwrap();
        assert_eq!(beside(&dir.path().join("gemma-3-4b-it-Q4_K_M.gguf")), None);
    }
}
