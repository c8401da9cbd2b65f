//! A host's cores: the processors a virtual host's programs run on.
//!
//! The hosts of a virtual rack share the machine's processors, so two hosts' busy threads
//! (each spinning for its next packet, as a network thread does) can end up taking turns on one
//! core, which never happens between real hosts. A host given cores (`cores = [1]` in its
//! `[[host]]` table) has its agent, the management host if it runs there, and every program
//! started in it (`rackwire rack exec`, `rackwire launch --rack`) held to those cores; the
//! machine's other programs are not.
//!
//! A process starts with the cores of the thread that started it, so a program is held to a
//! host's cores by starting it from a thread held to them ([`on_cores`]): no helper program, no
//! code between `fork` and `exec`.

use std::io;

use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};

/// The highest core number a host may name (the kernel's processor set holds this many).
pub const CORE_MAX: usize = CpuSet::MAX_CPU - 1;
/// The most cores one host may list.
pub const CORES_PER_HOST_MAX: usize = 256;

/// The cores this process may run on, lowest first.
pub fn usable() -> io::Result<Vec<usize>> {
    let set = sched_getaffinity(None)?;
    Ok((0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect())
}

/// Hold the calling thread to `cores` (empty: leave it as it is). Threads and processes it
/// starts afterwards are held to them too. Every core must exist: an error otherwise (the
/// thread is then left as it was).
pub fn pin_this_thread(cores: &[usize]) -> io::Result<()> {
    if cores.is_empty() {
        return Ok(());
    }
    let mut set = CpuSet::new();
    for &c in cores {
        if c > CORE_MAX {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("core {c} is above {CORE_MAX}")));
        }
        set.set(c);
    }
    Ok(sched_setaffinity(None, &set)?)
}

/// Run `f` on a thread of its own held to `cores` (empty: on one like the caller): a program
/// it spawns starts held to them. The caller's thread is left as it is.
pub fn on_cores<T: Send>(cores: &[usize], f: impl FnOnce() -> T + Send) -> io::Result<T> {
    if cores.is_empty() {
        return Ok(f());
    }
    std::thread::scope(|s| {
        s.spawn(|| pin_this_thread(cores).map(|()| f()))
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the thread that starts a host's program panicked")))
    })
}

/// `cores` as a short list for messages: `0-3,6`.
pub fn cores_text(cores: &[usize]) -> String {
    let mut sorted = cores.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] == sorted[j] + 1 {
            j += 1;
        }
        parts.push(if i == j { sorted[i].to_string() } else { format!("{}-{}", sorted[i], sorted[j]) });
        i = j + 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that a thread run through `on_cores` sees exactly the cores it was given (read
    // back from the kernel with sched_getaffinity), that the calling thread keeps its own, and
    // that a process started from that thread inherits them (read from /proc/self/status of a
    // `grep` child, which prints its own allowed list).
    #[test]
    fn a_thread_and_its_children_run_on_the_cores_given_and_the_caller_keeps_its_own() {
        let before = usable().unwrap();
        let one = [*before.last().unwrap()];
        let seen = on_cores(&one, || usable().unwrap()).unwrap();
        assert_eq!(seen, one);
        assert_eq!(usable().unwrap(), before, "the caller's cores are untouched");
        let child = on_cores(&one, || {
            std::process::Command::new("grep").args(["^Cpus_allowed_list", "/proc/self/status"]).output()
        })
        .unwrap()
        .unwrap();
        let text = String::from_utf8_lossy(&child.stdout);
        assert_eq!(text.split_whitespace().nth(1), Some(one[0].to_string().as_str()), "{text}");
    }

    // Checks that a core the kernel's set cannot hold is refused with an error (and the
    // thread's cores are left as they were), and that no cores means no change.
    #[test]
    fn impossible_cores_are_refused_and_none_changes_nothing() {
        let before = usable().unwrap();
        let err = on_cores(&[CORE_MAX + 1], || ()).unwrap_err();
        assert!(err.to_string().contains("above"), "{err}");
        assert_eq!(on_cores(&[], usable).unwrap().unwrap(), before);
    }

    // Checks the message form of a core list: runs joined with a dash, order and repeats
    // ignored.
    #[test]
    fn core_lists_read_as_ranges() {
        assert_eq!(cores_text(&[3, 0, 1, 2, 6, 6]), "0-3,6");
        assert_eq!(cores_text(&[5]), "5");
        assert_eq!(cores_text(&[]), "");
    }
}
