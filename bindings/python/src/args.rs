//! Arguments as Python gives them, checked: timeouts in seconds, access rights by name.

use std::time::Duration;

use pyo3::prelude::*;
use rackwire::Access;

use crate::errors::bad;

/// How long a wait lasts when none is given.
const WAIT_DEFAULT: f64 = 10.0;

/// The longest wait a timeout may ask for: a year (a deadline past it would overflow the
/// clock's arithmetic, which must give an error here, not a panic).
const WAIT_SECONDS_MAX: f64 = 365.0 * 86_400.0;

/// A timeout in seconds (`None`: the default), checked.
pub(crate) fn timeout(secs: Option<f64>) -> PyResult<Duration> {
    let s = secs.unwrap_or(WAIT_DEFAULT);
    if !(s.is_finite() && (0.0..=WAIT_SECONDS_MAX).contains(&s)) {
        return Err(bad(format!("timeout {s}: seconds, 0 to {WAIT_SECONDS_MAX}")));
    }
    Ok(Duration::from_secs_f64(s))
}

/// Access rights by name (`"rw"`, `"read|write"`, ...), checked.
pub(crate) fn access(s: &str) -> PyResult<Access> {
    s.parse::<Access>().map_err(|e| bad(format!("access {s:?}: {e}")))
}
