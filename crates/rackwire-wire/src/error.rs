//! Parse errors, each naming the field that failed.

/// Why bytes are not a valid frame (or payload).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The buffer ends before `field` does.
    #[error("truncated: {field} needs {need} bytes, {have} present")]
    Truncated {
        /// The field that did not fit.
        field: &'static str,
        /// Bytes needed up to the end of the field.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// The magic number is not ours.
    #[error("bad magic {0:#06x}")]
    BadMagic(u16),
    /// A version this build does not speak.
    #[error("unsupported version {0}")]
    BadVersion(u8),
    /// The header checksum does not match: the header was damaged.
    #[error("header checksum mismatch")]
    HeaderChecksum,
    /// The payload checksum does not match: the payload was damaged.
    #[error("payload checksum mismatch")]
    PayloadChecksum,
    /// A field holds a value outside its range.
    #[error("bad value in {field}")]
    BadValue {
        /// The field.
        field: &'static str,
    },
}

/// `Truncated` for `field` ending at `need` in a buffer of `have` bytes, if it does not fit.
pub(crate) fn need(field: &'static str, need: usize, have: usize) -> Result<(), WireError> {
    if have < need {
        Err(WireError::Truncated { field, need, have })
    } else {
        Ok(())
    }
}
