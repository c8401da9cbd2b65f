//! A live shared-memory ring and doorbell, with a peer scribbling on their shared words
//! between pushes, pops and looks, never panics.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| rackwire_shm::fuzz::scribble_ring(data));
