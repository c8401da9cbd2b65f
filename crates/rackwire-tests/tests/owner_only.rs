//! What a node keeps in files and folders is its user's alone: a runtime folder another user
//! made first, a folder open to others, or a key file others may read is refused when a node
//! joins, with the folder or file and the fix named, and never used.

use std::os::unix::fs::PermissionsExt;

use rackwire::{Error, Fabric, FabricConfig};
use rackwire_tests::{is_root, TempDir, TestMh, SECRET};

/// A node called `name` with its key under `state` and its socket's folder at `runtime`.
fn join(mh: &str, name: &str, state: &TempDir, runtime: &std::path::Path) -> Result<Fabric, Error> {
    let mut cfg = FabricConfig::new(mh, SECRET, name);
    cfg.state_dir = Some(state.0.clone());
    cfg.runtime_dir = Some(runtime.to_path_buf());
    Fabric::join(cfg)
}

// Checks the socket's folder (issue: another local user could make `/tmp/rackwire-<uid>`
// first and swap a node's socket): a folder open to the group (0770) is refused naming its
// mode; one that is a symbolic link to a good folder is refused; a good one (made by the
// node) works. As root, a folder owned by another user (uid 65534, as if made by them first)
// is refused naming its owner; not as root (a folder cannot be given away), that case is
// skipped, saying so.
#[test]
fn a_runtime_folder_not_the_users_own_is_refused() {
    let mh = TestMh::start("owner-only-runtime");
    let (state, base) = (TempDir::new("oo-state"), TempDir::new("oo-run"));
    let open = base.0.join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o770)).unwrap();
    match join(&mh.addr, "oo1", &state, &open) {
        Err(Error::Config(m)) => assert!(m.contains("mode 770") && m.contains("chmod 700"), "{m}"),
        other => panic!("a folder open to the group was used: {:?}", other.map(|f| f.id())),
    }
    let good = base.0.join("good");
    let link = base.0.join("link");
    std::fs::create_dir(&good).unwrap();
    std::fs::set_permissions(&good, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(&good, &link).unwrap();
    match join(&mh.addr, "oo2", &state, &link) {
        Err(Error::Config(m)) => assert!(m.contains("symbolic link"), "{m}"),
        other => panic!("a linked folder was used: {:?}", other.map(|f| f.id())),
    }
    let made = base.0.join("made-by-the-node");
    let f = join(&mh.addr, "oo3", &state, &made).expect("a folder the node makes itself is used");
    assert_eq!(std::fs::metadata(&made).unwrap().permissions().mode() & 0o777, 0o700);
    drop(f);
    if !is_root() {
        eprintln!("skipped: a folder owned by another user (needs root to give a folder away)");
        return;
    }
    let theirs = base.0.join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
    give_away(&theirs, 65534);
    match join(&mh.addr, "oo4", &state, &theirs) {
        Err(Error::Config(m)) => assert!(m.contains("belongs to user 65534"), "{m}"),
        other => panic!("another user's folder was used: {:?}", other.map(|f| f.id())),
    }
}

// Checks the key file (issue: an existing key file was loaded without a look at its mode or
// owner): a node's key file made readable by others (0644) makes the next join under that
// state folder fail, naming the file and `chmod 600`; put back to 0600 the node joins again
// with the same id.
#[test]
fn a_key_file_open_to_others_is_refused() {
    let mh = TestMh::start("owner-only-key");
    let (state, run) = (TempDir::new("oo-key"), TempDir::new("oo-key-run"));
    let runtime = run.0.join("r");
    let first = join(&mh.addr, "keyed", &state, &runtime).unwrap();
    let id = first.id();
    drop(first);
    let key = state.0.join("keys").join("keyed.key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    match join(&mh.addr, "keyed", &state, &runtime) {
        Err(Error::Config(m)) => assert!(m.contains("keyed.key") && m.contains("chmod 600"), "{m}"),
        other => panic!("a key file open to others was used: {:?}", other.map(|f| f.id())),
    }
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let again = loop {
        match join(&mh.addr, "keyed", &state, &runtime) {
            Ok(f) => break f,
            Err(e) if std::time::Instant::now() < deadline && e.to_string().contains("in use") => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            Err(e) => panic!("rejoin: {e}"),
        }
    };
    assert_eq!(again.id(), id);
}

/// Give `path` to user `uid` (root only).
fn give_away(path: &std::path::Path, uid: u32) {
    let status = std::process::Command::new("chown").arg(uid.to_string()).arg(path).status().expect("chown runs");
    assert!(status.success(), "chown {uid} {}", path.display());
}
