//! CRC32C (Castagnoli, the iSCSI polynomial), as frames carry it: computed with carry-less
//! multiplication on wide vectors where the processor has them (several times the speed of
//! the one-word CRC instruction on large payloads), else the fastest way it has.

use crc_fast::{CrcAlgorithm::Crc32Iscsi, Digest};

/// The CRC32C of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(data)
}

/// The CRC32C of the bytes `crc` was computed over followed by `data`.
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    // The running state is the finished value before its final inversion.
    let mut d = Digest::new_with_init_state(Crc32Iscsi, u64::from(!crc));
    d.update(data);
    d.finalize() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the algorithm against its published check value (CRC-32/ISCSI of "123456789" is
    // 0xe3069283), and a bit-at-a-time reference on inputs of every length class the vector
    // code treats differently (empty, short, one block, many blocks with a ragged tail).
    #[test]
    fn matches_the_catalogue_and_a_bitwise_reference() {
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        let bitwise = |data: &[u8]| {
            let mut c = !0u32;
            for &b in data {
                c ^= u32::from(b);
                for _ in 0..8 {
                    c = if c & 1 != 0 { (c >> 1) ^ 0x82f6_3b78 } else { c >> 1 };
                }
            }
            !c
        };
        let data: Vec<u8> = (0..70_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for len in [0, 1, 7, 15, 16, 63, 64, 255, 256, 1472, 4099, 65_507, 70_000] {
            assert_eq!(crc32c(&data[..len]), bitwise(&data[..len]), "length {len}");
        }
    }

    // Checks that a CRC built in two parts, cut anywhere (at either end, inside a vector block,
    // across block boundaries), equals the CRC of the whole.
    #[test]
    fn appending_equals_the_whole() {
        let data: Vec<u8> = (0..9_000u32).map(|i| (i * 31 + 7) as u8).collect();
        let whole = crc32c(&data);
        for cut in [0, 1, 28, 56, 64, 100, 4096, 8_999, 9_000] {
            assert_eq!(crc32c_append(crc32c(&data[..cut]), &data[cut..]), whole, "cut at {cut}");
        }
    }
}
