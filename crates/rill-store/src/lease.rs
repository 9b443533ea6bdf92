//! Who writes a streaming answer, and whether they are still there.
//!
//! Every answer row that streams names its writer: the process id, a token unique to the
//! writer within that process, and the last time it said it was alive (every
//! [`HEARTBEAT`], while text streams and while the answer is paused). When a store opens, an
//! answer left `streaming` becomes `interrupted` only if its writer is gone: its process has
//! ended, or (for another process here) no heartbeat came for [`LEASE`]. So `rill
//! conversations`, `rill chat` or `rill serve --save` opening the app's database leave the
//! app's live answers alone (issue 13), while a crash is still recovered at the next start.
//! Within one process, the live writers are kept in a registry, so a second store handle on the
//! same file (tests do this) knows which rows are still being written.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::Result;

/// How often a writer says it is alive.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// How long a writer of another process may stay silent before its answer counts as abandoned
/// (a process that is still running but hung, or one on another machine sharing the file).
pub const LEASE: Duration = Duration::from_secs(30);

static LIVE: Mutex<Option<HashSet<i64>>> = Mutex::new(None);
static NEXT: AtomicU64 = AtomicU64::new(0);

/// A writer's claim on its answer: registered while it lives, removed when dropped (also when
/// the task holding it is dropped with its runtime).
pub(crate) struct Claim {
    pub token: i64,
}

impl Claim {
    pub fn new() -> Claim {
        // Unique within the process; the start time keeps a later process with a reused pid
        // from handing out the same tokens.
        let start = crate::now_ms() << 16;
        let token = (start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed) as i64)) & i64::MAX;
        let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
        live.get_or_insert_with(HashSet::new).insert(token);
        Claim { token }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(set) = live.as_mut() {
            set.remove(&self.token);
        }
    }
}

/// This process's id, as stored.
pub(crate) fn pid() -> i64 {
    std::process::id() as i64
}

/// Whether process `pid` runs now; `None` where this platform cannot tell (there the lease
/// alone decides).
fn process_alive(pid: i64) -> Option<bool> {
    #[cfg(target_os = "linux")]
    {
        // A zombie (killed, not yet reaped by its parent) is gone as far as writing goes.
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(stat) => {
                let state = stat
                    .rsplit(')')
                    .next()
                    .and_then(|s| s.split_whitespace().next());
                Some(!matches!(state, Some("Z") | Some("X")))
            }
            Err(_) => Some(false),
        }
    }
    #[cfg(all(unix, not(target_os = "linux")))]
    {
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            return Some(false);
        };
        // SAFETY: signal 0 sends nothing; it only asks whether the process exists.
        let alive = unsafe { libc::kill(pid, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
        Some(alive)
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        None
    }
}

/// Whether the writer a streaming row names is gone, so the row should become `interrupted`.
pub(crate) fn writer_gone(
    writer_pid: Option<i64>,
    token: Option<i64>,
    seen_at: Option<i64>,
    now: i64,
) -> bool {
    let (Some(writer_pid), Some(token), Some(seen_at)) = (writer_pid, token, seen_at) else {
        return true; // written before writers were recorded, or never claimed
    };
    if writer_pid == pid() {
        let live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
        return !live.as_ref().is_some_and(|s| s.contains(&token));
    }
    if now.saturating_sub(seen_at) > LEASE.as_millis() as i64 {
        return true;
    }
    process_alive(writer_pid) == Some(false)
}

impl crate::Store {
    /// Marks `interrupted` the answers left `streaming` whose writer is gone (its process
    /// ended, or it fell silent for the lease); answers another program is writing right now are
    /// left alone. Returns how many were recovered.
    pub async fn recover_abandoned(&self) -> Result<u64> {
        // (id, writer_pid, writer_token, writer_seen_at)
        type Row = (i64, Option<i64>, Option<i64>, Option<i64>);
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT id, writer_pid, writer_token, writer_seen_at FROM messages WHERE status = 'streaming'",
        )
        .fetch_all(self.pool())
        .await?;
        let now = crate::now_ms();
        let mut recovered = 0;
        for (id, pid, token, seen) in rows {
            if writer_gone(pid, token, seen, now) {
                recovered += sqlx::query(
                    "UPDATE messages SET status = 'interrupted' WHERE id = ? AND status = 'streaming'
                         AND writer_token IS ?",
                )
                .bind(id)
                .bind(token)
                .execute(self.pool())
                .await?
                .rows_affected();
            }
        }
        Ok(recovered)
    }
}
