//! rackwire's C ABI. The header, `include/rackwire.h`, is generated from this file by
//! cbindgen (a test fails when the committed one is stale).
//!
//! Every function returns an [`RwStatus`]; on an error the message is kept for the calling
//! thread and [`rackwire_last_error`] returns it. Every entry point catches panics, so none
//! crosses into C (an internal fault is [`RwStatus::Internal`]). Handles are opaque boxes the
//! caller frees with the matching `_free` call.

// The C ABI is where raw pointers come in from foreign code: unsafe is allowed in this crate
// only, and each dereference says why it holds.
#![allow(unsafe_code)]
#![warn(missing_docs)]
// Every exported function checks its pointers for null before use; the rest of the contract
// (valid, aligned, live for the call) is the C caller's, as the header says.
#![allow(clippy::missing_safety_doc, clippy::not_unsafe_ptr_arg_deref)]

mod fabric;
mod group;
mod ops;
mod ptr;
mod status;
mod types;

pub use fabric::*;
pub use group::*;
pub use ops::*;
pub use status::*;
pub use types::*;
