//! Files and folders that make a node itself — its key, the folder of its endpoint socket, the
//! fabric secret, the management host's state — belong to the user the node runs as, and to
//! nobody else. Each is checked before use, never trusted for being where it was expected: a
//! folder in a shared place (`/tmp`) can be made first by another user, who could then swap
//! the node's socket or plant a key of their own.
//!
//! A folder must be a real folder (not a symbolic link), owned by this process's user, and
//! writable by nobody else; a private folder (where sockets live) open to nobody else at
//! all. A file must be a regular file (not a link), owned by this user, and open to nobody
//! else. Every folder above either belongs to this user or root and is written by nobody
//! else, unless it is root's and sticky (`/tmp`). A configuration file may be read by anyone
//! and be root's, but changed by nobody else ([`check_readable_file`]).

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::Path;

/// A file or folder that is not this user's alone.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {why}; {fix}")]
pub struct NotOwnerOnly {
    /// The file or folder.
    pub path: String,
    /// What is wrong with it.
    pub why: String,
    /// What fixes it.
    pub fix: String,
}

fn refuse(path: &Path, why: impl Into<String>, fix: impl Into<String>) -> NotOwnerOnly {
    NotOwnerOnly { path: path.display().to_string(), why: why.into(), fix: fix.into() }
}

/// The user this process acts as (owner of what it creates).
pub fn effective_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// How much of a folder others may have: `Private` folders none, `Shared` folders no write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// Open to its owner only (mode 0700 or less): sockets, keys.
    Private,
    /// Others may look, not change (no write for group or others).
    Readable,
}

/// Check the folder `path` (see the module documentation).
pub fn check_folder(path: &Path, reach: Reach) -> Result<(), NotOwnerOnly> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| refuse(path, e.to_string(), "check the path"))?;
    if meta.file_type().is_symlink() {
        return Err(refuse(path, "is a symbolic link", "remove it; rackwire makes the folder itself"));
    }
    if !meta.is_dir() {
        return Err(refuse(path, "is not a folder", "remove it; rackwire makes the folder itself"));
    }
    check_owner_and_mode(path, &meta, reach)?;
    check_ancestors(path)
}

/// Make the folder `path` (and its parents) with mode 0700 if it is missing, then check it.
pub fn create_folder(path: &Path, reach: Reach) -> Result<(), NotOwnerOnly> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|e| refuse(path, e.to_string(), "make it, or choose another folder"))?;
    check_folder(path, reach)
}

/// Check the file `path`, open to its owner only (see the module documentation).
pub fn check_file(path: &Path) -> Result<(), NotOwnerOnly> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| refuse(path, e.to_string(), "check the path"))?;
    if meta.file_type().is_symlink() {
        return Err(refuse(path, "is a symbolic link", "put the file itself there"));
    }
    if !meta.is_file() {
        return Err(refuse(path, "is not a regular file", "put the file itself there"));
    }
    check_owner_and_mode(path, &meta, Reach::Private)?;
    check_ancestors(path)
}

/// Check the file `path`, which others may read but not change (a configuration file): it
/// belongs to this process's user or to root, neither its group nor others may write it, and
/// no folder above it lets anyone else put another file in its place. A link is followed (a
/// host's configuration may be one), and the file it names is checked.
pub fn check_readable_file(path: &Path) -> Result<(), NotOwnerOnly> {
    let meta = std::fs::metadata(path).map_err(|e| refuse(path, e.to_string(), "check the path"))?;
    if !meta.is_file() {
        return Err(refuse(path, "is not a regular file", "put the file itself there"));
    }
    let (me, owner, mode) = (effective_uid(), meta.uid(), meta.mode() & 0o7777);
    if owner != me && owner != 0 {
        return Err(refuse(
            path,
            format!("belongs to user {owner}, neither this process's user {me} nor root"),
            "chown it to root (or to the user that runs rackwire)",
        ));
    }
    if mode & 0o022 != 0 {
        return Err(refuse(path, format!("may be changed by others (mode {mode:o})"), "chmod go-w it"));
    }
    let real = std::fs::canonicalize(path).map_err(|e| refuse(path, e.to_string(), "check the path"))?;
    check_ancestors(&real)
}

/// Check every folder above `path` (its parent up to `/`): each belongs to this user or to
/// root, and none other than a root-owned sticky one (such as `/tmp`, where nobody can move
/// or replace another user's entries) may be written by others. Whoever can write a folder
/// on the way can put another folder or file in place of what is below it.
pub fn check_ancestors(path: &Path) -> Result<(), NotOwnerOnly> {
    let me = effective_uid();
    let mut at = path.parent();
    while let Some(dir) = at.filter(|d| !d.as_os_str().is_empty()) {
        let meta = std::fs::metadata(dir).map_err(|e| refuse(dir, e.to_string(), "check the path"))?;
        let (owner, mode) = (meta.uid(), meta.mode() & 0o7777);
        if owner != me && owner != 0 {
            return Err(refuse(
                dir,
                format!("belongs to user {owner}, neither this process's user {me} nor root"),
                "keep rackwire's files under folders of your own",
            ));
        }
        let sticky_root = owner == 0 && mode & 0o1000 != 0;
        if mode & 0o022 != 0 && !sticky_root {
            return Err(refuse(dir, format!("may be written by others (mode {mode:o})"), "chmod go-w it"));
        }
        at = dir.parent();
    }
    Ok(())
}

fn check_owner_and_mode(path: &Path, meta: &std::fs::Metadata, reach: Reach) -> Result<(), NotOwnerOnly> {
    let me = effective_uid();
    if meta.uid() != me {
        return Err(refuse(
            path,
            format!("belongs to user {}, not to this process's user {me}", meta.uid()),
            "remove it (another user may have made it to take this node's place) or run as its owner",
        ));
    }
    let mode = meta.mode() & 0o7777;
    let open = match reach {
        Reach::Private => mode & 0o077,
        Reach::Readable => mode & 0o022,
    };
    if open != 0 {
        let want = if meta.is_dir() { "700" } else { "600" };
        return Err(refuse(path, format!("is open to others (mode {mode:o})"), format!("chmod {want} it")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn temp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("rw-owner-only-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    // Checks what a configuration file must be: one made here (0644) passes, and so does a
    // link to it; made writable by the group (0664) or by others (0646) it is refused with
    // the fix; a folder in its place is refused.
    #[test]
    fn a_configuration_file_others_may_change_is_refused() {
        let d = temp("readable");
        std::fs::create_dir_all(&d).unwrap();
        let f = d.join("rackwire.toml");
        std::fs::write(&f, "mh = \"h:1\"\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        check_readable_file(&f).unwrap();
        let link = d.join("link.toml");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        check_readable_file(&link).unwrap();
        for mode in [0o664, 0o646] {
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = check_readable_file(&f).unwrap_err();
            assert_eq!(e.fix, "chmod go-w it", "{e}");
        }
        assert!(check_readable_file(&d).is_err(), "a folder is no configuration file");
        let _ = std::fs::remove_dir_all(&d);
    }

    // Checks what a folder must be: a folder made here passes; opened to the group (0750 for a
    // private folder, 0770 for a readable one) it is refused naming the mode and the chmod
    // that fixes it; a symbolic link to a good folder is refused; a file where the folder
    // should be is refused.
    #[test]
    fn folders_must_be_real_owned_and_closed() {
        let d = temp("dir");
        create_folder(&d, Reach::Private).unwrap();
        check_folder(&d, Reach::Readable).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o750)).unwrap();
        let e = check_folder(&d, Reach::Private).unwrap_err();
        assert!(e.to_string().contains("mode 750") && e.to_string().contains("chmod 700"), "{e}");
        check_folder(&d, Reach::Readable).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o770)).unwrap();
        assert!(check_folder(&d, Reach::Readable).is_err());
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        let link = d.with_extension("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&d, &link).unwrap();
        assert!(check_folder(&link, Reach::Private).unwrap_err().to_string().contains("symbolic link"));
        let file = d.join("f");
        std::fs::write(&file, b"x").unwrap();
        assert!(check_folder(&file, Reach::Private).unwrap_err().to_string().contains("not a folder"));
        std::fs::remove_file(&link).unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }

    // Checks what a key or secret file must be: 0600 passes; 0640 and 0604 are refused with
    // the mode named; a symbolic link to a good file is refused.
    #[test]
    fn files_must_be_real_owned_and_closed() {
        let d = temp("file");
        create_folder(&d, Reach::Private).unwrap();
        let f = d.join("key");
        std::fs::write(&f, b"k").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        check_file(&f).unwrap();
        for mode in [0o640, 0o604] {
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
            assert!(check_file(&f).unwrap_err().to_string().contains(&format!("mode {mode:o}")));
        }
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = d.join("link");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        assert!(check_file(&link).unwrap_err().to_string().contains("symbolic link"));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
