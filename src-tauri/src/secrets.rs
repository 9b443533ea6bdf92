//! Keys for remote servers, kept apart from the conversations.
//!
//! A chat answered by a remote server needs its API key, and a conversation's settings are
//! exported and shared: so keys never go into the settings (issue 13). They live in one JSON
//! file in the config dir (`~/.config/rill/secrets.json` on Linux; `RILL_CONFIG_DIR`
//! overrides the folder) that only the user can read (mode 0600, written whole and renamed into
//! place), keyed by the server's address. An OS keyring would be better on a desktop, but has no
//! service under Xvfb or in CI, where the app is tested. A file that is not the JSON it should
//! be is never silently replaced (issue 40): it is moved aside as `secrets.json.corrupt-<time>`,
//! with a warning naming it, so the keys in it can still be recovered by hand.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use crate::error::Result;

/// The entry of the app's own API key.
const APP_API_KEY: &str = "rill app api";

pub struct Secrets {
    path: PathBuf,
    /// Serialises read-modify-write of the file.
    lock: Mutex<()>,
}

/// A server address as a key: without spaces, trailing slashes or `/v1`, so
/// `http://gpu:8000/v1/` and `http://gpu:8000` share one key.
fn server(url: &str) -> String {
    url.trim()
        .trim_end_matches('/')
        .trim_end_matches("/v1")
        .trim_end_matches('/')
        .to_owned()
}

impl Secrets {
    /// The secrets file of this user (see the module docs).
    pub fn for_user() -> Secrets {
        let dir = std::env::var_os("RILL_CONFIG_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                dirs::config_dir()
                    .unwrap_or_else(|| PathBuf::from("."))
                    .join("rill")
            });
        Secrets::at(dir.join("secrets.json"))
    }

    pub fn at(path: PathBuf) -> Secrets {
        Secrets {
            path,
            lock: Mutex::new(()),
        }
    }

    fn read(&self) -> BTreeMap<String, String> {
        let Ok(text) = std::fs::read_to_string(&self.path) else {
            return BTreeMap::new();
        };
        match serde_json::from_str(&text) {
            Ok(all) => all,
            Err(e) => {
                self.keep_aside(&e.to_string());
                BTreeMap::new()
            }
        }
    }

    /// Moves a damaged secrets file aside (the module docs) and says where.
    fn keep_aside(&self, why: &str) {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let aside = self.path.with_extension(format!("json.corrupt-{secs}"));
        match std::fs::rename(&self.path, &aside) {
            Ok(()) => tracing::warn!(
                file = %self.path.display(), kept = %aside.display(), error = %why,
                "the secrets file was damaged; it was kept aside and a new one is started"
            ),
            Err(e) => tracing::warn!(
                file = %self.path.display(), error = %e,
                "the secrets file is damaged and could not be moved aside"
            ),
        }
    }

    /// The key kept for the server at `url`.
    pub fn remote_key(&self, url: &str) -> Option<String> {
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.read().remove(&server(url))
    }

    /// The key the app's own API server asks for, if one is set (kept here, not in the
    /// database, since issue 40). Its entry's name is not a URL, so no server's can clash.
    pub fn app_api_key(&self) -> Option<String> {
        self.remote_key(APP_API_KEY)
    }

    /// Keeps (or, with `None`, forgets) the app's own API key.
    pub fn set_app_api_key(&self, key: Option<&str>) -> Result<()> {
        self.set_remote_key(APP_API_KEY, key)
    }

    /// Keeps (or, with `None`, forgets) the key for the server at `url`.
    pub fn set_remote_key(&self, url: &str, key: Option<&str>) -> Result<()> {
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut all = self.read();
        match key {
            Some(k) => all.insert(server(url), k.to_owned()),
            None => all.remove(&server(url)),
        };
        self.write(&all)
    }

    fn write(&self, all: &BTreeMap<String, String>) -> Result<()> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = self.path.with_extension("json.tmp");
        let text = serde_json::to_string_pretty(all).unwrap_or_default();
        {
            use std::io::Write;
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create(true).truncate(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt;
                options.mode(0o600);
            }
            let mut f = options.open(&tmp)?;
            #[cfg(unix)]
            {
                // The mode above applies only when the file is created.
                use std::os::unix::fs::PermissionsExt;
                f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
            }
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &self.path)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_kept_per_server_in_a_file_only_the_user_reads() {
        let dir = tempfile::tempdir().unwrap();
        let s = Secrets::at(dir.path().join("rill/secrets.json"));
        assert_eq!(s.remote_key("http://gpu:8000"), None);
        s.set_remote_key("http://gpu:8000/v1/", Some("sk-1"))
            .unwrap();
        s.set_remote_key("https://other", Some("sk-2")).unwrap();
        assert_eq!(s.remote_key("http://gpu:8000").as_deref(), Some("sk-1"));
        assert_eq!(s.remote_key(" http://gpu:8000/ ").as_deref(), Some("sk-1"));
        s.set_remote_key("http://gpu:8000", None).unwrap();
        assert_eq!(s.remote_key("http://gpu:8000"), None);
        assert_eq!(s.remote_key("https://other").as_deref(), Some("sk-2"));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join("rill/secrets.json"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn a_damaged_file_is_kept_aside_not_silently_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secrets.json");
        std::fs::write(&path, "{\"http://gpu:8000\": \"sk-1\", oops").unwrap();
        let s = Secrets::at(path.clone());
        assert_eq!(s.remote_key("http://gpu:8000"), None);
        s.set_remote_key("https://other", Some("sk-2")).unwrap();
        let aside: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("secrets.json.corrupt-"))
            .collect();
        assert_eq!(aside.len(), 1, "{aside:?}");
        let kept = std::fs::read_to_string(dir.path().join(&aside[0])).unwrap();
        assert!(kept.contains("sk-1"), "{kept}");
        assert_eq!(s.remote_key("https://other").as_deref(), Some("sk-2"));
    }
}
