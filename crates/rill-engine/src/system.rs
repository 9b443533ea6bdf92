//! What the operating system reports about memory: what it can give us, and `/proc` figures of
//! this process. At the ground of the crate, beside the error type.

/// Memory the system can give us (`MemAvailable`), or 4 GiB where that cannot be read.
pub(crate) fn available_memory() -> usize {
    proc_kb_field("/proc/meminfo", "MemAvailable").unwrap_or(4 << 30)
}

/// A `kB` figure of a `/proc` file (`/proc/meminfo`, `/proc/self/status`: lines of
/// `Field:   1234 kB`) in bytes; `None` where there is no such file or field.
pub(crate) fn proc_kb_field(path: &str, field: &str) -> Option<usize> {
    let text = std::fs::read_to_string(path).ok()?;
    let rest = text
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?;
    Some(rest.split_whitespace().next()?.parse::<usize>().ok()? * 1024)
}
