//! A memory barrier on every thread of this process at once (Linux `membarrier`).
//!
//! It lets a thread that is rarely on a path make the frequent side of a handshake cheap: a
//! thread that announces "I am using this" with a plain store and then checks a flag needs
//! no fence of its own between the two if the rare side, after changing the flag, runs
//! [`all_threads`] before it looks at the announcements (as userspace RCU does). Every
//! thread then has passed a full barrier, so either the announcement is visible to the rare
//! side or the flag's change is visible to the frequent one.

use std::sync::OnceLock;

/// Whether this process may use [`all_threads`] (registered once, on first ask). False on
/// kernels without the expedited private command (before Linux 4.14) or where a sandbox
/// forbids the system call; callers then keep their own fences.
pub fn available() -> bool {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    *REGISTERED.get_or_init(|| {
        use rustix::thread::{membarrier, membarrier_query, MembarrierCommand, MembarrierQuery};
        membarrier_query().contains(MembarrierQuery::PRIVATE_EXPEDITED)
            && membarrier(MembarrierCommand::RegisterPrivateExpedited).is_ok()
    })
}

/// Run a full memory barrier on every running thread of this process before returning.
/// Only valid once [`available`] said true.
pub fn all_threads() -> std::io::Result<()> {
    rustix::thread::membarrier(rustix::thread::MembarrierCommand::PrivateExpedited).map_err(Into::into)
}

#[cfg(test)]
mod tests {
    // Checks that the barrier can be registered and run on this machine's kernel (the pinned
    // shared-memory path depends on it; without it that path is not offered), and that a run
    // before registration would not be attempted: `available` registers first.
    #[test]
    fn registers_and_runs() {
        if !super::available() {
            eprintln!("membarrier is not available here: the pinned path is off");
            return;
        }
        super::all_threads().expect("a registered process may run the barrier");
    }
}
