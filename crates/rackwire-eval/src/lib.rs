//! rackwire's data workloads, each run over the fabric and over plain TCP between the same
//! processes, and the energy model that prices their runs.
//!
//! The workloads are the ones the source papers measure: a distributed sort in the sort
//! benchmark's format ([`sort`], HP's JouleSort-style shuffle) and a distributed grep in four
//! compute/network mixes ([`grep`], HP's Fig. 3). Each is a job of ranks ([`rackwire_coll::Group`]):
//! the data moves over a [`net::DataPath`], either the fabric (one-sided writes into the
//! receiver's registered memory) or TCP sockets, and every run checks its own output. The
//! [`energy`] model turns a run's time and CPU use into joules with a component power table
//! whose every value names its source; its figures are estimates, and say so.

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod command;
pub mod dfsio;
pub mod dsm;
pub mod dsm_model;
pub mod dsm_runs;
pub mod energy;
pub mod energy_tables;
pub mod figures;
pub mod grep;
pub mod job;
pub mod kv;
pub mod net;
pub mod plot;
pub mod rapl;
pub mod records;
pub mod report;
pub mod runs;
pub mod sort;
pub mod streams;

pub use job::{Phase, RunResult};
pub use net::{DataPath, FabricPath, Net, TcpPath};

/// What can go wrong in a workload run.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// The group or the fabric failed.
    #[error(transparent)]
    Group(#[from] rackwire_coll::CollError),
    /// The fabric refused or failed an operation.
    #[error(transparent)]
    Fabric(#[from] rackwire::Error),
    /// The TCP path failed.
    #[error("tcp: {0}")]
    Tcp(String),
    /// Reading or writing a workload's files failed.
    #[error("file: {0}")]
    Io(String),
    /// The output is wrong (the run's own check failed).
    #[error("wrong output: {0}")]
    WrongOutput(String),
    /// A sort's output failed validation.
    #[error("sort output: {0}")]
    Validation(#[from] records::ValidationError),
    /// Arguments that do not fit.
    #[error("bad argument: {0}")]
    BadArgument(String),
}
