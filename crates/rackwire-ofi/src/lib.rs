//! rackwire as a libfabric (OFI) provider: programs written to libfabric — MPI through Open
//! MPI's `mtl ofi`, libfabric's own tools — run unmodified on the fabric, picked by
//! `FI_PROVIDER=rackwire` with `FI_PROVIDER_PATH` naming the folder of `librackwire-fi.so`.
//!
//! The C side (`src/prov.c`, `src/prov_ep.c`, `src/prov_info.c`, sharing `src/provider.h`) holds libfabric's objects,
//! laid out by its own headers, and calls this crate for everything they do: the engine
//! ([`engine`]) joins the fabric once per process from the environment (`RACKWIRE_MH`, the
//! secret, as every rackwire program), names endpoints by node and number, and carries
//! messages and tagged messages over rackwire's messages ([`wire`]), matched at the
//! receiver ([`ep`]) and completed into queues ([`queues`]); RMA and atomics onto registered
//! memory are requests the target's provider checks and carries out ([`rma`], [`atomics`]).
//! What it offers: `FI_EP_RDM` with `FI_MSG`, `FI_TAGGED`, `FI_RMA`, `FI_ATOMIC` (remote CQ
//! data, `FI_SOURCE`, directed receives, injects, `FI_PEEK`/`FI_CLAIM`/`FI_DISCARD`, cancel),
//! completion queues of every format, counters, address vectors (table and map), `FI_MULTI_RECV`;
//! manual progress, and automatic progress by a thread of its own ([`auto`]) where asked for.
//! `FI_WAIT_FD` completion queues (the fabric's doorbell as the descriptor, armed by
//! `fi_trywait`). Not yet: wait sets, poll sets, scalable endpoints (see docs/ofi.md).

pub mod atomics;
pub mod auto;
pub mod consts;
pub mod endpoint;
pub mod engine;
pub mod ep;
pub mod objects;
pub mod queues;
mod regions;
pub mod rma;
mod tx;
pub mod user;
pub mod wire;

/// Whether this build has its libfabric side (libfabric's headers were found): only then is
/// there a provider library for libfabric to load.
pub const BUILT_WITH_LIBFABRIC: bool = cfg!(rwofi_c);

#[cfg(rwofi_c)]
mod abi;

#[cfg(rwofi_c)]
#[allow(unsafe_code)]
mod ini {
    extern "C" {
        fn rwofi_c_provider() -> *mut std::ffi::c_void;
    }

    /// libfabric's entry point into an external provider: the provider's description.
    #[no_mangle]
    pub extern "C" fn fi_prov_ini() -> *mut std::ffi::c_void {
        // SAFETY: a C function without arguments returning a pointer to a static structure.
        unsafe { rwofi_c_provider() }
    }
}
