//! The small helpers of the management host's line protocol, for both ends: a line at most
//! so long, JSON on it, the clock its records use.

use std::io::{BufRead, Write};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::MH_LINE_BYTES_MAX;

/// Milliseconds since the Unix epoch (0 for a clock before it).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Read one line of at most [`MH_LINE_BYTES_MAX`] bytes. `Ok(None)` at end of stream.
pub(crate) fn read_line(r: &mut impl BufRead, buf: &mut String) -> std::io::Result<Option<()>> {
    read_line_max(r, buf, MH_LINE_BYTES_MAX)
}

/// One line of at most `max` bytes.
pub(crate) fn read_line_max(r: &mut impl BufRead, buf: &mut String, max: usize) -> std::io::Result<Option<()>> {
    buf.clear();
    let n = std::io::Read::take(r, max as u64 + 1).read_line(buf)?;
    if n == 0 {
        return Ok(None);
    }
    if n > max {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "line too long"));
    }
    Ok(Some(()))
}

/// Write `v` as one line of JSON.
pub(crate) fn write_json(w: &mut impl Write, v: &impl serde::Serialize) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(v).map_err(std::io::Error::other)?;
    line.push(b'\n');
    w.write_all(&line)?;
    w.flush()
}
