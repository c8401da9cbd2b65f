//! An established connection fed arbitrary (checksum-valid) frames never panics and only
//! emits frames it can parse itself.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| rackwire_sim::fuzz::fuzz_connection(data));
