//! The files a package installs that the command itself describes: a manual page for
//! `rackwire` and for each of its commands (from the same definitions `--help` prints), one for
//! the configuration file (`rackwire.toml(5)`, from the list of keys the reader is tested
//! against), and the shell completions (bash, zsh, fish).

use std::path::Path;

use anyhow::{Context, Result};
use clap::CommandFactory;

/// Write `man/man1/rackwire*.1`, `man/man5/rackwire.toml.5` and
/// `completions/{rackwire.bash,_rackwire,rackwire.fish}`
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
    let man5 = dir.join("man/man5");
    std::fs::create_dir_all(&man5)?;
    let path = man5.join("rackwire.toml.5");
    std::fs::write(&path, config_page())?;
    written.push(path);
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

/// `rackwire.toml(5)`: every key of the configuration file, from [`rackwire::CONFIG_KEYS`].
fn config_page() -> String {
    use roff::{bold, roman, Roff};
    let plain = |s: &str| s.replace('`', "");
    let mut page = Roff::new();
    page.control("TH", ["RACKWIRE.TOML", "5"]);
    page.control("SH", ["NAME"]).text([roman("rackwire.toml - the configuration file of a rackwire host")]);
    page.control("SH", ["DESCRIPTION"]).text([roman(format!(
        "Every rackwire program reads one TOML file: RACKWIRE_CONFIG when it is set (set empty: \
         none), else {} when it exists. The environment variables override the file, and a \
         command's flags override both. rackwire config check says what is wrong with a file, \
         one line per problem.",
        rackwire::CONFIG_PATH_DEFAULT
    ))]);
    for (table, title) in [("", "KEYS"), ("management_host", "[management_host]")] {
        page.control("SH", [title]);
        if !table.is_empty() {
            page.text([roman("What rackwire mh on this host runs with when its flags do not say.")]);
        }
        for k in rackwire::CONFIG_KEYS.iter().filter(|k| k.table == table) {
            page.control("TP", []).text([
                bold(k.key),
                roman(format!(
                    " ({}; default: {}; also: {})",
                    plain(k.kind),
                    plain(&(k.default)()),
                    plain(&k.also.to_string())
                )),
            ]);
            page.text([roman(plain(k.meaning))]);
        }
    }
    page.control("SH", ["SEE ALSO"])
        .text([roman("rackwire(1), rackwire-config(1), rackwire-doctor(1), rackwire-mh(1)")]);
    page.render()
}
