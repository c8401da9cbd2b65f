//! Builds the C side of the provider against the system's libfabric headers, and links
//! `ofi/librackwire-fi.so` (the name libfabric looks for) to the library cargo makes.
//! Without the headers (Debian: libfabric-dev) the crate builds without the C side and says
//! so; its tests then skip.

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=src/provider.h");
    for f in ["src/prov.c", "src/prov_ep.c", "src/prov_info.c"] {
        println!("cargo:rerun-if-changed={f}");
    }
    println!("cargo:rustc-check-cfg=cfg(rwofi_c)");
    let headers =
        ["/usr/include", "/usr/local/include"].iter().any(|d| Path::new(d).join("rdma/providers/fi_prov.h").exists());
    if !headers {
        println!(
            "cargo:warning=libfabric's headers (rdma/providers/fi_prov.h) are missing: the provider is built \
             without its libfabric side (install libfabric-dev)"
        );
        return;
    }
    cc::Build::new()
        .files(["src/prov.c", "src/prov_ep.c", "src/prov_info.c"])
        .flag_if_supported("-std=gnu11")
        .warnings(true)
        .extra_warnings(true)
        .flag_if_supported("-Werror")
        .compile("rackwire_fi_c");
    println!("cargo:rustc-link-lib=fabric");
    println!("cargo:rustc-cfg=rwofi_c");
    link_provider_name();
}

/// `target/<profile>/ofi/librackwire-fi.so` -> `../deps/librackwire_fi.so`: the profile folder
/// is three above this build's `OUT_DIR` (`target/<profile>/build/<crate>-<hash>/out`). The
/// library in `deps` is the one every build writes (`cargo build` copies it up a folder as well,
/// `cargo test` does not).
fn link_provider_name() {
    let Some(out) = std::env::var_os("OUT_DIR").map(PathBuf::from) else { return };
    let Some(profile) = out.ancestors().nth(3) else { return };
    let dir = profile.join("ofi");
    let link = dir.join("librackwire-fi.so");
    if std::fs::create_dir_all(&dir).is_err() {
        return;
    }
    let _ = std::fs::remove_file(&link);
    if let Err(e) = std::os::unix::fs::symlink("../deps/librackwire_fi.so", &link) {
        println!("cargo:warning=could not link {}: {e}", link.display());
    }
}
