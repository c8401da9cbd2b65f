//! The Python package's own tests (pytest), run from `cargo test`: the package is built with
//! maturin, installed into a folder of its own, and its tests run against it, with the
//! rackwire launcher for the job tests. Without python3, maturin, pytest or numpy the test
//! says so and passes (CI installs them: .ci/run).

use std::path::{Path, PathBuf};
use std::process::Command;

fn have(module: &str) -> bool {
    Command::new("python3").args(["-c", &format!("import {module}")]).output().is_ok_and(|o| o.status.success())
}

/// The folder cargo put this profile's binaries in.
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    exe.parent().and_then(Path::parent).expect("target/<profile>").to_path_buf()
}

fn run(cmd: &mut Command, what: &str) -> String {
    let o = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    let out = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{what} failed:\n{out}");
    out
}

// Builds the package, installs it, and runs bindings/python/tests (every call of the API,
// every exception class, zero-copy regions, the GIL released while waiting, and jobs of
// ranks under `rackwire launch` with numpy arrays); fails if any Python test fails.
#[test]
fn python_package_tests_pass() {
    let missing: Vec<&str> = ["maturin", "pytest", "numpy"].into_iter().filter(|m| !have(m)).collect();
    if !missing.is_empty() {
        eprintln!("skipped: python3 with {} is needed (pip install maturin pytest numpy)", missing.join(", "));
        return;
    }
    let pkg = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = rackwire_tests::TempDir::new("python-package");
    let wheels = tmp.0.join("wheels");
    let site = tmp.0.join("site");
    let mut build = Command::new("python3");
    build.args(["-m", "maturin", "build", "--quiet", "-o"]).arg(&wheels).current_dir(pkg);
    if bin_dir().file_name().is_some_and(|p| p == "release") {
        build.arg("--release");
    }
    run(&mut build, "maturin build");
    let wheel = std::fs::read_dir(&wheels)
        .expect("wheels folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .expect("a wheel");
    run(
        Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "--no-deps", "--target"])
            .arg(&site)
            .arg(&wheel),
        "pip install",
    );
    // The launcher, for the job tests (cargo builds only this package's targets for its tests).
    let mut cargo = Command::new(env!("CARGO"));
    cargo.args(["build", "--quiet", "-p", "rackwire-cli", "--bin", "rackwire"]);
    if bin_dir().file_name().is_some_and(|p| p == "release") {
        cargo.arg("--release");
    }
    run(&mut cargo, "building the rackwire launcher");
    let out = run(
        Command::new("python3")
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
            .arg(pkg.join("tests"))
            .env("PYTHONPATH", &site)
            .env("RACKWIRE_BIN", bin_dir().join("rackwire"))
            .env_remove("RACKWIRE_MH"),
        "pytest",
    );
    eprintln!("{out}");
    assert!(out.contains(" passed") && !out.contains("skipped"), "every Python test ran:\n{out}");
}
