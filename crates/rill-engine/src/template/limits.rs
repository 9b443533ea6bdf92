//! Limits that keep a chat template from taking the process down.
//!
//! A chat template is code inside an untrusted model file, and Rill runs it. Measured on the
//! code before these limits (issue 40): a namespace holding itself written with `tojson`, or a
//! dictionary nested 90,000 deep, overflowed the stack and aborted the process; two nested
//! `range(100000)` loops or `tojson(indent=1000000000)` never finished; `{%}` and
//! `strftime_now('%Z')` panicked. Each render now runs under these limits:
//!
//! - **fuel** ([`FUEL`]): minijinja counts the instructions a render executes and stops it with
//!   an error when they run out, so no loop is endless. The longest real render we know (every
//!   template in llama.cpp's folder over a long conversation with tools, `tests/templates.rs`)
//!   uses a small share of it.
//! - **depth** ([`MAX_DEPTH`]): what we write recursively (`tojson`, printing a dict or list,
//!   `|string`, `|pprint`) stops at 128 levels with an error. A value that holds itself (a
//!   namespace stored in itself) is caught the same way: it is a value nested without end.
//! - **size** ([`MAX_RENDERED`], [`MAX_INDENT`], [`MAX_SOURCE`]): the rendered text, every
//!   `tojson` result and the template itself have a ceiling, and `indent` at most 32.
//! - **a thread of its own** ([`guarded`]): each render runs on a short-lived thread with a deep
//!   stack, so minijinja's own recursion (bounded by the fuel) has room, and a panic anywhere in
//!   it — ours, minijinja's or a library's — is caught and becomes an error, without the panic
//!   message on the terminal.
//!
//! A render that runs into one of these is an [`Error::TemplateLimit`], told apart from a
//! template's own refusals ([`Error::Template`]: `raise_exception`, an undefined value), which
//! real templates make for conversations they do not take: loading refuses a model whose
//! template runs into a limit, not one whose template refuses a question.
//!
//! What is not bounded: memory a template builds by concatenating strings (`~` in a loop that
//! doubles), which minijinja does not limit. The fuel bounds the number of doublings, not
//! their size.

use std::cell::Cell;
use std::sync::Once;

use crate::error::{Error, Result};

/// Instructions one render may execute.
pub const FUEL: u64 = 4_000_000;
/// Deepest nesting `tojson` and printing write.
pub const MAX_DEPTH: usize = 128;
/// Longest rendered prompt, and longest `tojson` result, in bytes.
pub const MAX_RENDERED: usize = 32 << 20;
/// Widest `tojson` indent.
pub const MAX_INDENT: usize = 32;
/// Longest template source a model file may carry (real ones are under 50 KB).
pub const MAX_SOURCE: usize = 1 << 20;
/// Stack of the thread a render runs on: reserved, not committed, until used.
const RENDER_STACK: usize = 1 << 30;
/// The render thread's name, by which the panic hook knows to keep quiet.
const RENDER_THREAD: &str = "rill-template";

thread_local! {
    /// Whether the render on this thread ran into a limit (rather than failing as templates
    /// do, with `raise_exception` or an undefined value).
    static TRIPPED: Cell<bool> = const { Cell::new(false) };
}

/// Marks this thread's render as having run into a limit.
pub(crate) fn trip() {
    TRIPPED.with(|t| t.set(true));
}

/// Whether this thread's render ran into a limit.
pub(crate) fn tripped() -> bool {
    TRIPPED.with(Cell::get)
}

/// Refuses to write `what` (`tojson`, printing) deeper than [`MAX_DEPTH`] or past
/// [`MAX_RENDERED`] in `out`.
pub(crate) fn within(what: &str, depth: usize, out: &str) -> Result<(), minijinja::Error> {
    if depth > MAX_DEPTH {
        return Err(too_deep(what));
    }
    if out.len() > MAX_RENDERED {
        return Err(too_long(what));
    }
    Ok(())
}

/// The error for a value nested past [`MAX_DEPTH`].
fn too_deep(what: &str) -> minijinja::Error {
    trip();
    minijinja::Error::new(
        minijinja::ErrorKind::InvalidOperation,
        format!("{what}: a value nested deeper than {MAX_DEPTH} levels (or one that holds itself)"),
    )
}

/// The error for text past [`MAX_RENDERED`].
fn too_long(what: &str) -> minijinja::Error {
    trip();
    minijinja::Error::new(
        minijinja::ErrorKind::InvalidOperation,
        format!("{what}: the text grew past {} MB", MAX_RENDERED >> 20),
    )
}

/// Collects rendered text up to [`MAX_RENDERED`] bytes; past that every write fails, which
/// ends the render.
#[derive(Default)]
pub(crate) struct Capped(pub Vec<u8>);

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > MAX_RENDERED {
            return Err(std::io::Error::other(format!(
                "the rendered prompt grew past {} MB",
                MAX_RENDERED >> 20
            )));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Runs `f` (a render) on a thread of its own with a deep stack; a panic in it is a
/// [`Error::Template`] naming the panic, printed nowhere.
pub(crate) fn guarded<T: Send>(f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    quiet_render_panics();
    std::thread::scope(|scope| {
        let thread = std::thread::Builder::new()
            .name(RENDER_THREAD.into())
            .stack_size(RENDER_STACK)
            .spawn_scoped(scope, f)
            .map_err(|e| Error::TemplateLimit(format!("could not start rendering: {e}")))?;
        thread.join().unwrap_or_else(|panic| {
            let what = crate::error::panic_message(panic.as_ref());
            Err(Error::TemplateLimit(format!("rendering crashed: {what}")))
        })
    })
}

/// Installs (once) a panic hook that says nothing for a render thread's panic, which
/// [`guarded`] reports as an error, and passes every other panic to the hook before it.
fn quiet_render_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let before = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name() != Some(RENDER_THREAD) {
                before(info);
            }
        }));
    });
}
