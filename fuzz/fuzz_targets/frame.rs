//! Parsing arbitrary bytes as a frame and its payload never panics (raw, and sealed with valid
//! checksums so the payload parsers are reached).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| rackwire_wire::check_sealed(data));
