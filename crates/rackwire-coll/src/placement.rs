//! Where a rank is: its rank, the job's size and name, found from whichever launcher started
//! the process.

use crate::{CollError, RANKS_MAX};

/// Which launcher's variables gave a [`Placement`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlacementSource {
    /// `RACKWIRE_RANK`, `RACKWIRE_SIZE`, `RACKWIRE_JOB` (`rackwire launch`).
    Rackwire,
    /// Open MPI's mpirun: `OMPI_COMM_WORLD_RANK`, `_SIZE`, `_LOCAL_RANK`.
    OpenMpi,
    /// PMIx: `PMIX_RANK` (the size from `PMIX_SIZE` or another launcher's variable).
    Pmix,
    /// MPICH's Hydra: `PMI_RANK`, `PMI_SIZE`.
    Hydra,
    /// Slurm's srun: `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, the job from
    /// `SLURM_JOB_ID`.`SLURM_STEP_ID`.
    Slurm,
    /// `RANK`, `WORLD_SIZE` (torchrun and others).
    Generic,
}

/// A rank's place in its job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// This process's rank, 0..size.
    pub rank: usize,
    /// Ranks in the job.
    pub size: usize,
    /// Rank among the job's processes on this machine, when the launcher says.
    pub local_rank: Option<usize>,
    /// The job's name: ranks of one job must agree on it.
    pub job: String,
    /// Where it came from.
    pub source: PlacementSource,
}

fn parse(var: &str, v: String) -> Result<usize, CollError> {
    v.trim().parse().map_err(|_| CollError::Config(format!("{var}={v:?} is not a number")))
}

impl Placement {
    /// From the process environment; see [`Placement::from_vars`].
    pub fn from_env() -> Result<Placement, CollError> {
        Placement::from_vars(|k| std::env::var(k).ok())
    }

    /// From variables looked up by `get`, in this order: rackwire's own (`RACKWIRE_RANK`,
    /// `RACKWIRE_SIZE`, `RACKWIRE_JOB`), Open MPI's, PMIx's, Hydra's, Slurm's, then `RANK` and
    /// `WORLD_SIZE`. The first launcher whose rank variable is set decides. The job name is
    /// `RACKWIRE_JOB` if set (whatever the launcher), else one the launcher gives (Open MPI's
    /// job id, PMIx's namespace, Slurm's job and step), else `job`.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Placement, CollError> {
        type Source = (PlacementSource, &'static str, &'static [&'static str], Option<&'static str>);
        const SOURCES: [Source; 6] = [
            (PlacementSource::Rackwire, rackwire::vars::RANK, &[rackwire::vars::SIZE], None),
            (
                PlacementSource::OpenMpi,
                "OMPI_COMM_WORLD_RANK",
                &["OMPI_COMM_WORLD_SIZE"],
                Some("OMPI_COMM_WORLD_LOCAL_RANK"),
            ),
            (
                PlacementSource::Pmix,
                "PMIX_RANK",
                &["PMIX_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"],
                Some("PMIX_LOCAL_RANK"),
            ),
            (PlacementSource::Hydra, "PMI_RANK", &["PMI_SIZE"], Some("MPI_LOCALRANKID")),
            (PlacementSource::Slurm, "SLURM_PROCID", &["SLURM_NTASKS"], Some("SLURM_LOCALID")),
            (PlacementSource::Generic, "RANK", &["WORLD_SIZE"], Some("LOCAL_RANK")),
        ];
        for (source, rank_var, size_vars, local_var) in SOURCES {
            let Some(rank) = get(rank_var) else { continue };
            let rank = parse(rank_var, rank)?;
            let size = size_vars
                .iter()
                .find_map(|v| get(v).map(|s| (v, s)))
                .ok_or_else(|| CollError::Config(format!("{rank_var} is set but not {}", size_vars.join(" or "))))?;
            let size = parse(size.0, size.1)?;
            let local_rank = local_var.and_then(|v| get(v).map(|s| parse(v, s))).transpose()?;
            let job = get(rackwire::vars::JOB)
                .or_else(|| match source {
                    PlacementSource::OpenMpi => get("OMPI_MCA_ess_base_jobid").map(|j| format!("ompi-{j}")),
                    PlacementSource::Pmix => get("PMIX_NAMESPACE").map(|n| format!("pmix-{n}")),
                    PlacementSource::Slurm => get("SLURM_JOB_ID")
                        .map(|j| format!("slurm-{j}.{}", get("SLURM_STEP_ID").unwrap_or_else(|| "0".into()))),
                    _ => None,
                })
                .unwrap_or_else(|| "job".into());
            let job: String =
                job.chars().map(|c| if c.is_ascii_alphanumeric() || "-_./:@".contains(c) { c } else { '_' }).collect();
            check(rank, size)?;
            return Ok(Placement { rank, size, local_rank, job, source });
        }
        Err(CollError::Config(
            "no rank in the environment: start this program with `rackwire launch`, mpirun or srun, or set \
             RACKWIRE_RANK and RACKWIRE_SIZE"
                .into(),
        ))
    }
}

/// A rank and size a group can have.
pub(crate) fn check(rank: usize, size: usize) -> Result<(), CollError> {
    if size == 0 || size > RANKS_MAX {
        return Err(CollError::Config(format!("group size {size} outside 1..={RANKS_MAX}")));
    }
    if rank >= size {
        return Err(CollError::Config(format!("rank {rank} outside 0..{size}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    // Checks each launcher's variables, and that the order is the documented one: with both
    // Open MPI's and Slurm's set (mpirun inside an allocation), Open MPI's win; RACKWIRE_JOB
    // names the job whatever the launcher.
    #[test]
    fn each_launcher_and_the_order_between_them() {
        let p = Placement::from_vars(vars(&[
            (rackwire::vars::RANK, "1"),
            (rackwire::vars::SIZE, "3"),
            (rackwire::vars::JOB, "j1"),
        ]))
        .unwrap();
        assert_eq!((p.rank, p.size, p.job.as_str(), p.source), (1, 3, "j1", PlacementSource::Rackwire));
        let p = Placement::from_vars(vars(&[
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("OMPI_MCA_ess_base_jobid", "77"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "9"),
        ]))
        .unwrap();
        assert_eq!((p.rank, p.size, p.local_rank, p.source), (2, 4, Some(0), PlacementSource::OpenMpi));
        assert_eq!(p.job, "ompi-77");
        let p =
            Placement::from_vars(vars(&[("PMIX_RANK", "0"), ("PMI_SIZE", "2"), ("PMIX_NAMESPACE", "ns 1")])).unwrap();
        assert_eq!((p.size, p.job.as_str(), p.source), (2, "pmix-ns_1", PlacementSource::Pmix));
        let p = Placement::from_vars(vars(&[("PMI_RANK", "1"), ("PMI_SIZE", "2")])).unwrap();
        assert_eq!((p.rank, p.job.as_str(), p.source), (1, "job", PlacementSource::Hydra));
        let p = Placement::from_vars(vars(&[
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_JOB_ID", "123"),
            ("SLURM_STEP_ID", "2"),
        ]))
        .unwrap();
        assert_eq!((p.rank, p.local_rank, p.job.as_str()), (3, Some(1), "slurm-123.2"));
        let p = Placement::from_vars(vars(&[("RANK", "0"), ("WORLD_SIZE", "1"), (rackwire::vars::JOB, "t")])).unwrap();
        assert_eq!((p.source, p.job.as_str()), (PlacementSource::Generic, "t"));
    }

    // Checks that bad or missing variables are clear errors naming the variable.
    #[test]
    fn bad_variables_are_named() {
        let e = Placement::from_vars(vars(&[])).unwrap_err().to_string();
        assert!(e.contains("rackwire launch"), "{e}");
        let e = Placement::from_vars(vars(&[(rackwire::vars::RANK, "x"), (rackwire::vars::SIZE, "2")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains(rackwire::vars::RANK), "{e}");
        let e = Placement::from_vars(vars(&[("PMI_RANK", "0")])).unwrap_err().to_string();
        assert!(e.contains("PMI_SIZE"), "{e}");
        let e = Placement::from_vars(vars(&[("RANK", "2"), ("WORLD_SIZE", "2")])).unwrap_err().to_string();
        assert!(e.contains("outside"), "{e}");
        assert!(Placement::from_vars(vars(&[("RANK", "0"), ("WORLD_SIZE", "100000")])).is_err());
    }
}
