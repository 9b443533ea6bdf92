//! Where models come from: the models folder, files imported in place, the Hugging Face cache,
//! and downloads from Hugging Face through hf-hub.
//!
//! Downloads go into the standard Hugging Face cache (`HF_HOME`, default
//! `~/.cache/huggingface`), so a model fetched by another tool is found, and one fetched by
//! Rill is found by them. `HF_ENDPOINT` points hf-hub at a mirror, `HF_TOKEN` authenticates.
//! Imported files are used where they are, never copied: their paths are listed in
//! `imported.txt` in the models folder.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::model::{inspect, ModelInfo};

/// The folder Rill keeps models in: `RILL_MODELS_DIR`, else the platform data dir
/// (`~/.local/share/rill/models` on Linux).
pub fn models_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("RILL_MODELS_DIR") {
        return PathBuf::from(d);
    }
    dirs::data_dir()
        .unwrap_or_else(|| PathBuf::from("."))
        .join("rill")
        .join("models")
}

fn hf_cache_dir() -> PathBuf {
    match std::env::var_os("HF_HOME") {
        Some(h) => PathBuf::from(h).join("hub"),
        None => dirs::home_dir()
            .unwrap_or_default()
            .join(".cache")
            .join("huggingface")
            .join("hub"),
    }
}

fn imported_list(dir: &Path) -> PathBuf {
    dir.join("imported.txt")
}

fn gguf_files_under(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() && depth > 0 {
            gguf_files_under(&p, depth - 1, out);
        } else if p
            .extension()
            .is_some_and(|x| x.eq_ignore_ascii_case("gguf"))
            && p.is_file()
        {
            out.push(p);
        }
    }
}

/// This machine's memory in bytes, where it can be read (Linux: `MemTotal` in `/proc/meminfo`;
/// macOS: `sysctl hw.memsize`), so the models list can say which downloads will not fit.
pub fn machine_memory() -> Option<u64> {
    if let Ok(m) = std::fs::read_to_string("/proc/meminfo") {
        return m
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| kb * 1024);
    }
    if cfg!(target_os = "macos") {
        let out = std::process::Command::new("sysctl")
            .args(["-n", "hw.memsize"])
            .output()
            .ok()?;
        return String::from_utf8(out.stdout).ok()?.trim().parse().ok();
    }
    None
}

/// One model file on this machine, and where it was found.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LocalModel {
    pub source: &'static str,
    #[serde(flatten)]
    pub info: ModelInfo,
    /// Why the file cannot be used (a damaged header, a chat template that fails), when it
    /// cannot: it is listed all the same, so the user sees what is wrong with it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The vision projector beside it, when there is one: the model reads images.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub projector: Option<PathBuf>,
}

/// Every GGUF model on this machine that Rill knows of: the models folder, imported files and
/// the Hugging Face cache. Listing reads headers and compiles templates, never runs one, so a
/// hostile file costs its header's reading; a file that fails is listed with its error.
pub fn list(dir: &Path) -> Vec<LocalModel> {
    let mut found: Vec<(&'static str, PathBuf)> = Vec::new();
    let mut own = Vec::new();
    gguf_files_under(dir, 2, &mut own);
    found.extend(own.into_iter().map(|p| ("models", p)));
    if let Ok(list) = std::fs::read_to_string(imported_list(dir)) {
        found.extend(
            list.lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| ("imported", PathBuf::from(l.trim()))),
        );
    }
    let mut cached = Vec::new();
    gguf_files_under(&hf_cache_dir(), 4, &mut cached);
    found.extend(cached.into_iter().map(|p| ("hf-cache", p)));

    let mut seen = std::collections::HashSet::new();
    found
        .into_iter()
        // A projector is not a model: it shows as its model's `projector`.
        .filter(|(_, p)| !crate::vision::is_projector(p))
        .filter(|(_, p)| seen.insert(std::fs::canonicalize(p).unwrap_or_else(|_| p.clone())))
        .map(|(source, p)| match inspect(&p) {
            Ok(info) => LocalModel {
                source,
                info,
                error: None,
                projector: crate::vision::beside(&p),
            },
            Err(e) => {
                tracing::warn!(path = %p.display(), error = %e, "a model file that cannot be used");
                LocalModel {
                    source,
                    info: ModelInfo::unreadable(&p),
                    error: Some(e.to_string()),
                    projector: None,
                }
            }
        })
        .collect()
}

/// Registers a GGUF file where it lies (after checking it is one). Idempotent.
pub fn import(dir: &Path, file: &Path) -> Result<ModelInfo> {
    let path = std::fs::canonicalize(file).map_err(|e| Error::model_file(file, e.to_string()))?;
    let info = inspect(&path)?;
    std::fs::create_dir_all(dir)?;
    let list_path = imported_list(dir);
    let current = std::fs::read_to_string(&list_path).unwrap_or_default();
    let line = path.to_string_lossy().into_owned();
    if !current.lines().any(|l| l.trim() == line) {
        let mut next = current;
        if !next.is_empty() && !next.ends_with('\n') {
            next.push('\n');
        }
        next.push_str(&line);
        next.push('\n');
        // Write-then-rename: a full disk leaves the old list intact.
        let tmp = list_path.with_extension("txt.tmp");
        std::fs::write(&tmp, next)?;
        std::fs::rename(&tmp, &list_path)?;
    }
    Ok(info)
}

/// Download progress, in bytes.
pub trait DownloadProgress {
    fn start(&mut self, file: &str, total_bytes: usize);
    fn advance(&mut self, bytes: usize);
    fn finish(&mut self);
    /// Polled as bytes arrive: true stops the download (the partial file is kept to resume).
    fn cancelled(&self) -> bool {
        false
    }
}

/// Unwinds out of hf-hub's copy loop when the user cancels. hf-hub offers no cancellation,
/// and its progress callback is the only code of ours inside the loop; `resume_unwind` does
/// not run the panic hook (nothing is printed) and [`pull`] catches exactly this payload.
struct Cancel;

struct Adapter<'a, P: DownloadProgress>(&'a mut P);

impl<P: DownloadProgress> hf_hub::api::Progress for Adapter<'_, P> {
    fn init(&mut self, size: usize, filename: &str) {
        self.0.start(filename, size);
    }
    fn update(&mut self, size: usize) {
        if self.0.cancelled() {
            std::panic::resume_unwind(Box::new(Cancel));
        }
        self.0.advance(size);
    }
    fn finish(&mut self) {
        self.0.finish();
    }
}

/// Picks the GGUF file to fetch from a repository's file list: a 4-bit K-quant when there is
/// one (the usual quality/size balance), else the first GGUF.
pub fn choose_gguf(files: &[String]) -> Option<String> {
    let ggufs: Vec<&String> = files
        .iter()
        .filter(|f| f.to_ascii_lowercase().ends_with(".gguf"))
        .collect();
    for pref in ["q4_k_m", "q4_k_s", "q4_0", "q8_0"] {
        if let Some(f) = ggufs.iter().find(|f| f.to_ascii_lowercase().contains(pref)) {
            return Some((*f).clone());
        }
    }
    ggufs.first().map(|f| (*f).clone())
}

/// Downloads `REPO` or `REPO:FILE` from Hugging Face into the HF cache and returns its path.
/// A file already complete in the cache is returned without touching the network; otherwise
/// hf-hub retries a broken connection (3 times, with backoff) and resumes the partial file an
/// earlier try, a cancel or an earlier run left (`*.part` beside the blob).
/// `progress.cancelled()` stops it with [`Error::DownloadCancelled`].
pub fn pull(spec: &str, progress: &mut impl DownloadProgress) -> Result<PathBuf> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pull_inner(spec, progress))) {
        Ok(result) => result,
        Err(payload) if payload.is::<Cancel>() => Err(Error::DownloadCancelled),
        Err(payload) => std::panic::resume_unwind(payload),
    }
}

/// Whether `name` is a plain name: letters, digits, `-`, `_` and `.`, and not `.` or `..`.
fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Checks a file name within a repository: a relative name ending in `.gguf`, in folders of the
/// repository at most (`Q4_K_M/model.gguf`), never a path out of it: no `..`, no leading `/`,
/// no backslash, no drive (issue 40). The name reaches the cache's folders as it is.
pub fn check_file_name(file: &str) -> Result<()> {
    let bad = |why: &str| {
        Err(Error::param(
            "model",
            format!("`{file}` is not a file name in the repository: {why}"),
        ))
    };
    if !file.to_ascii_lowercase().ends_with(".gguf") {
        return bad("Rill downloads .gguf files only");
    }
    if file.starts_with('/') || file.contains('\\') || file.contains(':') {
        return bad("a name, not a path");
    }
    if !file.split('/').all(|part| {
        !part.is_empty() && part != "." && part != ".." && !part.chars().any(char::is_control)
    }) {
        return bad("no `..`, `.` or empty folder in it");
    }
    Ok(())
}

/// `OWNER/REPO` or `OWNER/REPO:FILE.gguf`, checked: plain owner and repository names, and a
/// file name that stays inside the repository ([`check_file_name`]).
pub fn parse_spec(spec: &str) -> Result<(&str, Option<&str>)> {
    let (repo, file) = match spec.split_once(':') {
        Some((r, f)) => (r, Some(f)),
        None => (spec, None),
    };
    let parts: Vec<&str> = repo.split('/').collect();
    if parts.len() != 2 || !parts.iter().all(|p| plain_name(p)) {
        return Err(Error::param(
            "model",
            format!("`{spec}` is not OWNER/REPO or OWNER/REPO:FILE.gguf"),
        ));
    }
    if let Some(f) = file {
        check_file_name(f)?;
    }
    Ok((repo, file))
}

fn pull_inner(spec: &str, progress: &mut impl DownloadProgress) -> Result<PathBuf> {
    let (repo, file) = parse_spec(spec)?;
    let file = file.map(str::to_owned);
    let api = hf_hub::api::sync::ApiBuilder::from_env()
        .with_retries(3)
        .build()
        .map_err(|e| Error::Download(e.to_string()))?;
    let repo_api = api.model(repo.to_owned());
    let file = match file {
        Some(f) => f,
        None => {
            let info = repo_api
                .info()
                .map_err(|e| Error::Download(format!("{repo}: {e}")))?;
            let files: Vec<String> = info.siblings.into_iter().map(|s| s.rfilename).collect();
            let file = choose_gguf(&files)
                .ok_or_else(|| Error::Download(format!("{repo} has no .gguf file")))?;
            // The listing comes from the network: its names are checked as a user's would be.
            check_file_name(&file)?;
            file
        }
    };
    // Already complete in the cache (fetched by Rill or any other Hugging Face tool): no network.
    if let Some(path) = hf_hub::Cache::from_env().model(repo.to_owned()).get(&file) {
        return Ok(path);
    }
    repo_api
        .download_with_progress(&file, Adapter(progress))
        .map_err(|e| Error::Download(format!("{repo}/{file}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choose_gguf_prefers_q4_k_m() {
        let files = ["README.md", "m.Q8_0.gguf", "m.Q4_K_M.gguf", "m.f16.gguf"].map(String::from);
        assert_eq!(choose_gguf(&files).as_deref(), Some("m.Q4_K_M.gguf"));
        assert_eq!(
            choose_gguf(&["a.f16.gguf".to_string()]).as_deref(),
            Some("a.f16.gguf")
        );
        assert_eq!(choose_gguf(&["README.md".to_string()]), None);
    }

    #[test]
    fn a_malformed_repo_spec_is_rejected_before_any_network_use() {
        struct Quiet;
        impl DownloadProgress for Quiet {
            fn start(&mut self, _: &str, _: usize) {}
            fn advance(&mut self, _: usize) {}
            fn finish(&mut self) {}
        }
        for bad in ["", "noslash", "a/b/c", "/x"] {
            assert!(
                matches!(
                    pull(bad, &mut Quiet),
                    Err(Error::InvalidParam { field: "model", .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_file_name_that_leaves_the_repository_is_refused_issue_40() {
        for bad in [
            "o/r:/etc/passwd.gguf",
            "o/r:../../../.bashrc.gguf",
            "o/r:a/../../x.gguf",
            "o/r:..\\x.gguf",
            "o/r:C:/x.gguf",
            "o/r:a//b.gguf",
            "o/r:./x.gguf",
            "o/r:model.bin",
            "o/r:",
            "../r:x.gguf",
            "o/..:x.gguf",
            "o/r r:x.gguf",
        ] {
            assert!(
                matches!(
                    parse_spec(bad),
                    Err(Error::InvalidParam { field: "model", .. })
                ),
                "{bad}"
            );
        }
        assert_eq!(parse_spec("o/r").unwrap(), ("o/r", None));
        assert_eq!(
            parse_spec("Qwen/Qwen3-0.6B-GGUF:Q4_K_M/qwen3.Q4_K_M.gguf").unwrap(),
            ("Qwen/Qwen3-0.6B-GGUF", Some("Q4_K_M/qwen3.Q4_K_M.gguf"))
        );
    }
}
