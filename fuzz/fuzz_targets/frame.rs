//! Parsing arbitrary bytes as a frame and its payload never panics.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| rackwire_wire::check_any(data));
