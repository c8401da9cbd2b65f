//! The committed header is the one cbindgen makes of the crate as it is now.

/// Set (to anything) to write the fresh header instead of comparing.
const BLESS: &str = "RACKWIRE_BLESS";

// Checks `include/rackwire.h` against a fresh cbindgen run over the crate and fails when they
// differ (a call added, changed or documented differently without the header following).
// `RACKWIRE_BLESS=1 cargo test -p rackwire-ffi --test header` writes the fresh one.
#[test]
fn header_is_current() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let cfg = cbindgen::Config::from_file(format!("{dir}/cbindgen.toml")).expect("cbindgen.toml");
    let mut fresh = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(cfg)
        .generate()
        .expect("cbindgen reads the crate")
        .write(&mut fresh);
    let path = format!("{dir}/include/rackwire.h");
    if std::env::var_os(BLESS).is_some() {
        std::fs::write(&path, &fresh).expect("write the header");
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "include/rackwire.h is stale: run `RACKWIRE_BLESS=1 cargo test -p rackwire-ffi --test header` and commit it"
    );
}

// Checks the pkg-config file against the crate: its version is the crate's, it links the
// library cargo builds, and the header it points at is the committed one's name.
#[test]
fn pkg_config_file_matches_the_crate() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let pc = std::fs::read_to_string(format!("{dir}/rackwire.pc")).expect("rackwire.pc");
    let field = |k: &str| pc.lines().find_map(|l| l.strip_prefix(k)).map(str::trim).unwrap_or_default().to_string();
    assert_eq!(field("Version:"), env!("CARGO_PKG_VERSION"));
    assert!(field("Libs:").contains("-lrackwire_ffi"), "{pc}");
    assert!(std::path::Path::new(&format!("{dir}/include/rackwire.h")).exists());
}
