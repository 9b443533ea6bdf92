//! Downloads through hf-hub against a local stand-in for Hugging Face (`HF_ENDPOINT`), with a
//! real HTTP exchange: a broken connection is retried and resumed, a cancel keeps the partial
//! file and the next try resumes it, and a file already in the cache is not fetched again.
//! One test in its own binary: it sets process-wide environment variables.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use rill_engine::hub::{pull, DownloadProgress};
use rill_engine::Error;

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// Serves one file under `/{repo}/resolve/main/{file}` with HTTP ranges, like the Hub. It
/// records every range asked for; `break_first` makes the first body stop halfway.
fn serve(body: Vec<u8>, break_first: bool) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let ranges = Arc::new(Mutex::new(Vec::new()));
    let seen = ranges.clone();
    std::thread::spawn(move || {
        let mut broken = !break_first;
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut range = String::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("range: bytes=") {
                    range = v.trim().to_owned();
                }
            }
            seen.lock().unwrap().push(range.clone());
            let (start, end) = match range.split_once('-') {
                Some((a, "")) => (a.parse().unwrap(), body.len() - 1),
                Some((a, b)) => (a.parse().unwrap(), b.parse::<usize>().unwrap()),
                None => (0, body.len() - 1),
            };
            let part = &body[start..=end];
            let head = format!(
                "HTTP/1.1 206 Partial Content\r\ncontent-length: {}\r\ncontent-range: bytes {start}-{end}/{}\r\n\
                 x-repo-commit: {COMMIT}\r\netag: \"blob-etag\"\r\nconnection: close\r\n\r\n",
                part.len(),
                body.len()
            );
            let _ = stream.write_all(head.as_bytes());
            if !broken && part.len() > 1 {
                // The connection drops halfway through the first real download.
                broken = true;
                let _ = stream.write_all(&part[..part.len() / 2]);
                continue;
            }
            let _ = stream.write_all(part);
        }
    });
    (url, ranges)
}

#[derive(Default)]
struct Recorder {
    total: usize,
    done: usize,
    cancel_after: Option<usize>,
}

impl DownloadProgress for Recorder {
    fn start(&mut self, _: &str, total_bytes: usize) {
        self.total = total_bytes;
    }
    fn advance(&mut self, bytes: usize) {
        self.done += bytes;
    }
    fn finish(&mut self) {}
    fn cancelled(&self) -> bool {
        self.cancel_after.is_some_and(|n| self.done >= n)
    }
}

fn body(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

fn starts(ranges: &Mutex<Vec<String>>) -> Vec<usize> {
    ranges
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.as_str() != "0-0")
        .map(|r| r.split('-').next().unwrap().parse().unwrap())
        .collect()
}

#[test]
fn downloads_retry_resume_cancel_and_use_the_cache() {
    let home = tempfile::tempdir().unwrap();
    std::env::set_var("HF_HOME", home.path());

    // 1. A connection that breaks halfway is retried from where it stopped.
    let data = body(3 << 20);
    let (url, ranges) = serve(data.clone(), true);
    std::env::set_var("HF_ENDPOINT", &url);
    let mut p = Recorder::default();
    let path = pull("rill-test/broken:model.gguf", &mut p).unwrap();
    assert_eq!(
        std::fs::read(&path).unwrap(),
        data,
        "the file arrives whole"
    );
    let s = starts(&ranges);
    assert_eq!(s.len(), 2, "one retry: {s:?}");
    assert_eq!(s[0], 0);
    assert!(s[1] > 0 && s[1] < data.len(), "the retry resumes: {s:?}");

    // 2. A cancel stops it and keeps the partial file; the next try resumes it.
    let data = body(4 << 20);
    let (url, ranges) = serve(data.clone(), false);
    std::env::set_var("HF_ENDPOINT", &url);
    let mut p = Recorder {
        cancel_after: Some(1 << 20),
        ..Default::default()
    };
    match pull("rill-test/cancel:model.gguf", &mut p) {
        Err(Error::DownloadCancelled) => {}
        other => panic!("expected a cancel, got {other:?}"),
    }
    assert!(p.done >= 1 << 20 && p.done < data.len());
    let mut p = Recorder::default();
    let path = pull("rill-test/cancel:model.gguf", &mut p).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), data);
    let s = starts(&ranges);
    assert_eq!(s.len(), 2, "{s:?}");
    assert!(s[1] > 0, "the second try resumes the partial file: {s:?}");

    // 3. Complete in the cache: returned without a request.
    let before = ranges.lock().unwrap().len();
    let again = pull("rill-test/cancel:model.gguf", &mut Recorder::default()).unwrap();
    assert_eq!(again, path);
    assert_eq!(
        ranges.lock().unwrap().len(),
        before,
        "no request for a cached file"
    );

    // 4. A server that is not there: a clear error, no panic.
    std::env::set_var("HF_ENDPOINT", "http://127.0.0.1:9");
    let err = pull("rill-test/absent:model.gguf", &mut Recorder::default()).unwrap_err();
    assert!(matches!(err, Error::Download(_)), "{err}");
}
