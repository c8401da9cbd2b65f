//! A rank of a test job: joins its group from the environment (as `rackwire launch`, mpirun
//! or srun start it) and runs one scenario, printing `ok` and exiting 0 when every check held.
//!
//! Scenarios (the first argument):
//! - `all [LENS] [ROUNDS] [RANDOM_MAX]`: every collective at each length (comma-separated),
//!   then ROUNDS rounds of random-count alltoallv, gatherv, scatterv and allgatherv.
//! - `allreduce-loop ITERS`: allreduce ITERS times (a test kills a rank meanwhile); an error
//!   is printed as `error KIND: TEXT` and the exit code is 3.
//! - `info`: print rank, size, job and the transport to every other rank.

use rackwire_coll::{CollError, Group, ReduceOp};
use rackwire_tests::collcheck;

fn kind(e: &CollError) -> &'static str {
    match e {
        CollError::RankGone { .. } => "rank_gone",
        CollError::Timeout { .. } => "timeout",
        CollError::Fabric(_) => "fabric",
        CollError::Limit(_) => "limit",
        CollError::BadArgument(_) => "bad_argument",
        CollError::Config(_) => "config",
    }
}

fn scenario(g: &mut Group, args: &[String]) -> Result<(), CollError> {
    match args.first().map(String::as_str) {
        Some("all") => {
            let lens: Vec<usize> = args
                .get(1)
                .map_or("0,8,1000,70000", String::as_str)
                .split(',')
                .map(|s| s.parse().expect("a length"))
                .collect();
            let rounds = args.get(2).map_or(3, |s| s.parse().expect("rounds"));
            let random_max = args.get(3).map_or(40_000, |s| s.parse().expect("bytes"));
            collcheck::run_all(g, &lens, rounds, random_max)
        }
        Some("allreduce-loop") => {
            let iters: usize = args.get(1).map_or(1_000_000, |s| s.parse().expect("iterations"));
            let mut v = vec![0u64; 1024];
            for i in 0..iters {
                v.fill(1);
                g.allreduce(&mut v, ReduceOp::Sum)?;
                if i == 0 {
                    println!("looping");
                }
            }
            Ok(())
        }
        Some("info") => {
            let transports: Vec<&str> = (0..g.size()).map(|r| g.transport(r).unwrap_or("?")).collect();
            println!("rank {} size {} job {} transports {}", g.rank(), g.size(), g.job(), transports.join(","));
            Ok(())
        }
        other => Err(CollError::Config(format!("unknown scenario {other:?}"))),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let outcome = Group::from_env().and_then(|mut g| {
        scenario(&mut g, &args)?;
        g.leave()
    });
    match outcome {
        Ok(()) => println!("ok"),
        Err(e) => {
            println!("error {}: {e}", kind(&e));
            std::process::exit(3);
        }
    }
}
