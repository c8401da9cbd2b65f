//! The files a package installs that the command itself describes: a manual page for
//! `rackwire` and for each of its commands (from the same definitions `--help` prints), and
//! the shell completions (bash, zsh, fish).

use std::path::Path;

use anyhow::{Context, Result};
use clap::CommandFactory;

/// Write `man/man1/rackwire*.1` and `completions/{rackwire.bash,_rackwire,rackwire.fish}`
/// under `dir`; the paths written.
pub(crate) fn write(dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    let mut written = Vec::new();
    let man = dir.join("man/man1");
    std::fs::create_dir_all(&man).with_context(|| format!("creating {}", man.display()))?;
    let cmd = crate::Cli::command();
    let mut pages = vec![("rackwire".to_string(), cmd.clone())];
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("rackwire-{}", sub.get_name());
        pages.push((name.clone(), sub.clone().name(name)));
    }
    for (name, page) in pages {
        let path = man.join(format!("{name}.1"));
        let mut out = Vec::new();
        clap_mangen::Man::new(page).render(&mut out)?;
        std::fs::write(&path, out).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
    }
    let completions = dir.join("completions");
    std::fs::create_dir_all(&completions)?;
    use clap_complete::Shell;
    for (shell, file) in [(Shell::Bash, "rackwire.bash"), (Shell::Zsh, "_rackwire"), (Shell::Fish, "rackwire.fish")] {
        let path = completions.join(file);
        let mut out = Vec::new();
        clap_complete::generate(shell, &mut crate::Cli::command(), "rackwire", &mut out);
        std::fs::write(&path, out).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}
