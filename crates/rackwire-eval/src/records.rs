//! Records in the sort benchmark's format, a generator in the spirit of `gensort`, and a
//! validation in the spirit of `valsort`.
//!
//! A record is [`RECORD_BYTES`] bytes: a [`KEY_BYTES`]-byte binary key, then a payload that
//! names the record (its number in hex) so that a lost, doubled or damaged record shows.
//! The layout follows `gensort`'s binary records: key, `00 11`, the record number as 32 hex
//! digits, `88 99 AA BB`, 48 filler bytes, `CC DD EE FF`. Keys come from a counter-based
//! generator (record number and seed in, key out), so every rank writes its own share of one
//! data set with no coordination, and a run is reproducible from its seed.
//!
//! Validation checks what `valsort` checks: each part in order, the parts in order with each
//! other, and the count and checksum of all records (the sum of each record's CRC-32) equal to
//! the input's, so a sort that loses, doubles or changes a record fails even when what it
//! wrote is in order.

use std::fmt;

/// Bytes of one record.
pub const RECORD_BYTES: usize = 100;
/// Bytes of a record's key, at its start.
pub const KEY_BYTES: usize = 10;
/// The most records one rank generates or holds (4 GB of records): past it a run is refused
/// before it starts instead of running the machine out of memory.
pub const RECORDS_PER_RANK_MAX: u64 = 40_000_000;

/// One step of SplitMix64: a well-mixed 64-bit value from a counter.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The key of record `n` of the data set `seed`.
pub fn key_of(seed: u64, n: u64) -> [u8; KEY_BYTES] {
    let a = mix(seed ^ mix(n));
    let b = mix(a ^ 0x5851_f42d_4c95_7f2d);
    let mut k = [0u8; KEY_BYTES];
    k[..8].copy_from_slice(&a.to_be_bytes());
    k[8..].copy_from_slice(&b.to_be_bytes()[..2]);
    k
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// Write record `n` of the data set `seed` into `out` (exactly [`RECORD_BYTES`] long).
pub fn write_record(seed: u64, n: u64, out: &mut [u8]) {
    debug_assert_eq!(out.len(), RECORD_BYTES);
    out[..KEY_BYTES].copy_from_slice(&key_of(seed, n));
    out[10] = 0x00;
    out[11] = 0x11;
    // The record number as 32 hex digits (a 128-bit number whose high half is zero).
    let num = u128::from(n);
    for (i, b) in out[12..44].iter_mut().enumerate() {
        *b = HEX[((num >> (4 * (31 - i))) & 0xf) as usize];
    }
    out[44..48].copy_from_slice(&[0x88, 0x99, 0xAA, 0xBB]);
    // Filler: runs of four equal hex digits taken from the record number, as gensort's are.
    for (i, b) in out[48..96].iter_mut().enumerate() {
        *b = HEX[((n >> (4 * ((i / 4) % 16))) & 0xf) as usize];
    }
    out[96..100].copy_from_slice(&[0xCC, 0xDD, 0xEE, 0xFF]);
}

/// Records `first .. first + count` of the data set `seed`, back to back.
pub fn generate(seed: u64, first: u64, count: u64) -> Vec<u8> {
    let mut out = vec![0u8; count as usize * RECORD_BYTES];
    for (i, rec) in out.chunks_exact_mut(RECORD_BYTES).enumerate() {
        write_record(seed, first + i as u64, rec);
    }
    out
}

/// The first `count` of `total` records that rank `rank` of `ranks` holds when a data set is
/// spread evenly (the first `total % ranks` ranks hold one more).
pub fn share(total: u64, ranks: usize, rank: usize) -> (u64, u64) {
    let (r, n) = (rank as u64, ranks as u64);
    let (base, extra) = (total / n, total % n);
    let first = r * base + r.min(extra);
    (first, base + u64::from(r < extra))
}

/// CRC-32 (the one of zlib and Ethernet) of one record, as `valsort` sums them.
pub fn record_crc(rec: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32IsoHdlc, rec) as u32
}

/// What `valsort` reports of a run of records: how many, their checksum, the first and last
/// key, and how many records are out of order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Summary {
    /// Records.
    pub records: u64,
    /// Sum of the records' CRC-32 (wrapping in 128 bits).
    pub checksum: u128,
    /// The first record's key (zero when there are none).
    pub first_key: [u8; KEY_BYTES],
    /// The last record's key (zero when there are none).
    pub last_key: [u8; KEY_BYTES],
    /// Records whose key is smaller than the one before.
    pub unordered: u64,
    /// Records whose key equals the one before.
    pub duplicate_keys: u64,
}

/// A run of records that does not pass validation.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    /// The data is not a whole number of records.
    #[error("{len} bytes are not a whole number of {RECORD_BYTES}-byte records")]
    Partial {
        /// Bytes given.
        len: usize,
    },
    /// Records out of order within a part.
    #[error("part {part}: {unordered} record(s) out of order")]
    Unordered {
        /// The part (rank).
        part: usize,
        /// How many.
        unordered: u64,
    },
    /// A part's first key is below the previous part's last.
    #[error("part {part} starts below the end of part {}", part - 1)]
    PartsOverlap {
        /// The part (rank).
        part: usize,
    },
    /// Records lost or doubled.
    #[error("{got} records, expected {expected}")]
    Count {
        /// Records found.
        got: u64,
        /// Records in the input.
        expected: u64,
    },
    /// Records changed (same count, different checksum).
    #[error("checksum {got:#x}, expected {expected:#x}: records were changed")]
    Checksum {
        /// Checksum found.
        got: u128,
        /// The input's.
        expected: u128,
    },
}

impl Summary {
    /// A summary of `data`, records back to back.
    pub fn of(data: &[u8]) -> Result<Summary, ValidationError> {
        if !data.len().is_multiple_of(RECORD_BYTES) {
            return Err(ValidationError::Partial { len: data.len() });
        }
        let mut s = Summary {
            records: 0,
            checksum: 0,
            first_key: [0; KEY_BYTES],
            last_key: [0; KEY_BYTES],
            unordered: 0,
            duplicate_keys: 0,
        };
        let mut prev: Option<&[u8]> = None;
        for rec in data.chunks_exact(RECORD_BYTES) {
            let key = &rec[..KEY_BYTES];
            match prev {
                None => s.first_key.copy_from_slice(key),
                Some(p) if key < p => s.unordered += 1,
                Some(p) if key == p => s.duplicate_keys += 1,
                Some(_) => {}
            }
            prev = Some(key);
            s.records += 1;
            s.checksum = s.checksum.wrapping_add(u128::from(record_crc(rec)));
        }
        if let Some(p) = prev {
            s.last_key.copy_from_slice(p);
        }
        Ok(s)
    }

    /// Checksum and count only, for an input whose order does not matter.
    pub fn unordered_of(data: &[u8]) -> Result<(u64, u128), ValidationError> {
        if !data.len().is_multiple_of(RECORD_BYTES) {
            return Err(ValidationError::Partial { len: data.len() });
        }
        let sum = data.chunks_exact(RECORD_BYTES).fold(0u128, |a, r| a.wrapping_add(u128::from(record_crc(r))));
        Ok(((data.len() / RECORD_BYTES) as u64, sum))
    }

    /// Check that `parts` (in rank order) form one sorted run holding exactly the records of
    /// an input of `records` records with checksum `checksum`.
    pub fn validate(parts: &[Summary], records: u64, checksum: u128) -> Result<(), ValidationError> {
        let mut last: Option<[u8; KEY_BYTES]> = None;
        for (i, p) in parts.iter().enumerate() {
            if p.unordered > 0 {
                return Err(ValidationError::Unordered { part: i, unordered: p.unordered });
            }
            if p.records == 0 {
                continue;
            }
            if last.is_some_and(|l| p.first_key < l) {
                return Err(ValidationError::PartsOverlap { part: i });
            }
            last = Some(p.last_key);
        }
        let got = parts.iter().map(|p| p.records).sum::<u64>();
        if got != records {
            return Err(ValidationError::Count { got, expected: records });
        }
        let sum = parts.iter().fold(0u128, |a, p| a.wrapping_add(p.checksum));
        if sum != checksum {
            return Err(ValidationError::Checksum { got: sum, expected: checksum });
        }
        Ok(())
    }

    /// The summary as bytes, to gather at one rank.
    pub fn to_bytes(&self) -> [u8; SUMMARY_BYTES] {
        let mut b = [0u8; SUMMARY_BYTES];
        b[..8].copy_from_slice(&self.records.to_le_bytes());
        b[8..24].copy_from_slice(&self.checksum.to_le_bytes());
        b[24..34].copy_from_slice(&self.first_key);
        b[34..44].copy_from_slice(&self.last_key);
        b[44..52].copy_from_slice(&self.unordered.to_le_bytes());
        b[52..60].copy_from_slice(&self.duplicate_keys.to_le_bytes());
        b
    }

    /// A summary from [`Summary::to_bytes`].
    pub fn from_bytes(b: &[u8; SUMMARY_BYTES]) -> Summary {
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        Summary {
            records: u64_at(0),
            checksum: u128::from_le_bytes(b[8..24].try_into().expect("16 bytes")),
            first_key: b[24..34].try_into().expect("10 bytes"),
            last_key: b[34..44].try_into().expect("10 bytes"),
            unordered: u64_at(44),
            duplicate_keys: u64_at(52),
        }
    }
}

/// Bytes of a [`Summary`] as [`Summary::to_bytes`] writes it.
pub const SUMMARY_BYTES: usize = 60;

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} records, checksum {:x}, {} duplicate keys", self.records, self.checksum, self.duplicate_keys)
    }
}

/// The 80-bit key of a record as a number, for comparisons and range partitioning.
pub fn key_number(rec: &[u8]) -> u128 {
    let mut k = [0u8; 16];
    k[6..].copy_from_slice(&rec[..KEY_BYTES]);
    u128::from_be_bytes(k)
}

/// Sort `data` (records back to back) by key into a new buffer.
pub fn sort_records(data: &[u8]) -> Vec<u8> {
    let from_slice = |at: usize, out: &mut [u8]| -> Result<(), std::convert::Infallible> {
        out.copy_from_slice(&data[at..at + out.len()]);
        Ok(())
    };
    match sort_from(data.len(), from_slice) {
        Ok(v) => v,
        Err(never) => match never {},
    }
}

/// Sort the `len` bytes of records that `read(offset, out)` reads (wherever they are) by
/// key into a new buffer: the keys with their positions are sorted (16 bytes each instead of
/// 100); then the records are read again in their own order, a block at a time, and each is
/// stored at its place in the output. Both passes read in large blocks, so records that lie
/// in another process's memory cost one call per block, not one per record.
pub fn sort_from<E>(len: usize, mut read: impl FnMut(usize, &mut [u8]) -> Result<(), E>) -> Result<Vec<u8>, E> {
    let n = len / RECORD_BYTES;
    assert!(n <= u32::MAX as usize, "sort_from: at most 2^32 records");
    let mut idx: Vec<u128> = Vec::with_capacity(n);
    let mut block = vec![0u8; KEY_SCAN_RECORDS.min(n.max(1)) * RECORD_BYTES];
    let mut i = 0;
    while i < n {
        let k = KEY_SCAN_RECORDS.min(n - i);
        read(i * RECORD_BYTES, &mut block[..k * RECORD_BYTES])?;
        for (j, r) in block[..k * RECORD_BYTES].chunks_exact(RECORD_BYTES).enumerate() {
            idx.push((key_number(r) << 32) | (i + j) as u128);
        }
        i += k;
    }
    idx.sort_unstable();
    // Where each record goes, by its position in the input.
    let mut place = vec![0u32; n];
    for (to, &k) in idx.iter().enumerate() {
        place[(k & 0xffff_ffff) as usize] = to as u32;
    }
    drop(idx);
    let mut out = vec![0u8; n * RECORD_BYTES];
    let mut i = 0;
    while i < n {
        let k = KEY_SCAN_RECORDS.min(n - i);
        read(i * RECORD_BYTES, &mut block[..k * RECORD_BYTES])?;
        for (j, r) in block[..k * RECORD_BYTES].chunks_exact(RECORD_BYTES).enumerate() {
            let to = place[i + j] as usize * RECORD_BYTES;
            out[to..to + RECORD_BYTES].copy_from_slice(r);
        }
        i += k;
    }
    Ok(out)
}

/// Records whose keys are read per block while sorting (a block of 64 KB stays in cache).
const KEY_SCAN_RECORDS: usize = 640;

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the record layout: the markers sit where gensort puts them, the record number
    // reads back from its hex digits, and the same seed and number give the same record.
    #[test]
    fn records_have_the_gensort_layout() {
        let mut r = [0u8; RECORD_BYTES];
        write_record(7, 0xABCDEF, &mut r);
        assert_eq!(&r[10..12], &[0x00, 0x11]);
        assert_eq!(&r[44..48], &[0x88, 0x99, 0xAA, 0xBB]);
        assert_eq!(&r[96..100], &[0xCC, 0xDD, 0xEE, 0xFF]);
        let num = std::str::from_utf8(&r[12..44]).unwrap();
        assert_eq!(u128::from_str_radix(num, 16).unwrap(), 0xABCDEF);
        let mut again = [0u8; RECORD_BYTES];
        write_record(7, 0xABCDEF, &mut again);
        assert_eq!(r, again);
        write_record(8, 0xABCDEF, &mut again);
        assert_ne!(r[..KEY_BYTES], again[..KEY_BYTES], "another seed, another key");
    }

    // Checks the shares: consecutive, covering the data set exactly, sizes within one.
    #[test]
    fn shares_cover_the_data_set() {
        for total in [0u64, 1, 7, 100, 1001] {
            for ranks in 1..=9 {
                let mut next = 0;
                for r in 0..ranks {
                    let (first, count) = share(total, ranks, r);
                    assert_eq!(first, next);
                    assert!(count >= total / ranks as u64 && count <= total / ranks as u64 + 1);
                    next += count;
                }
                assert_eq!(next, total);
            }
        }
    }

    // Checks the validation: a sorted split of generated records passes; a lost record, a
    // doubled one, a changed byte, a swap inside a part and overlapping parts each fail with
    // their own error.
    #[test]
    fn validation_catches_every_kind_of_damage() {
        let data = generate(3, 0, 500);
        let (n, sum) = Summary::unordered_of(&data).unwrap();
        let sorted = sort_records(&data);
        let (a, b) = sorted.split_at(200 * RECORD_BYTES);
        let parts = [Summary::of(a).unwrap(), Summary::of(b).unwrap()];
        Summary::validate(&parts, n, sum).unwrap();

        let lost = [Summary::of(a).unwrap(), Summary::of(&b[RECORD_BYTES..]).unwrap()];
        assert!(matches!(Summary::validate(&lost, n, sum), Err(ValidationError::Count { .. })));

        let mut changed = sorted.clone();
        changed[250 * RECORD_BYTES + 50] ^= 1;
        let (a2, b2) = changed.split_at(200 * RECORD_BYTES);
        let parts = [Summary::of(a2).unwrap(), Summary::of(b2).unwrap()];
        assert!(matches!(Summary::validate(&parts, n, sum), Err(ValidationError::Checksum { .. })));

        let mut swapped = sorted.clone();
        let (x, y) = swapped.split_at_mut(RECORD_BYTES);
        x.swap_with_slice(&mut y[..RECORD_BYTES]);
        let parts = [Summary::of(&swapped).unwrap()];
        assert!(matches!(Summary::validate(&parts, n, sum), Err(ValidationError::Unordered { .. })));

        let parts = [Summary::of(b).unwrap(), Summary::of(a).unwrap()];
        assert!(matches!(Summary::validate(&parts, n, sum), Err(ValidationError::PartsOverlap { .. })));

        assert!(matches!(Summary::of(&data[1..]), Err(ValidationError::Partial { .. })));
        let s = Summary::of(a).unwrap();
        assert_eq!(Summary::from_bytes(&s.to_bytes()), s);
    }

    // Checks the sort against the standard library's sort of whole records.
    #[test]
    fn sort_records_matches_a_plain_sort() {
        let data = generate(11, 40, 3000);
        let mut plain: Vec<&[u8]> = data.chunks_exact(RECORD_BYTES).collect();
        plain.sort_by(|x, y| x[..KEY_BYTES].cmp(&y[..KEY_BYTES]));
        assert_eq!(sort_records(&data), plain.concat());
    }
}
