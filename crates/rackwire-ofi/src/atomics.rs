//! Atomic operations as libfabric names them (`fi_atomic(3)`): which datatype and operation
//! pairs the provider does in which form, and what each does to the target's elements. The
//! target's provider carries them out one at a time (under its lock), so they are atomic
//! with respect to each other, as libfabric asks; the bytes are little-endian elements.

/// `enum fi_datatype` values handled (the C side checks them against the headers).
pub const FI_INT8: i32 = 0;
/// The last integer type (`FI_UINT64`).
pub const FI_UINT64: i32 = 7;
/// `FI_FLOAT`.
pub const FI_FLOAT: i32 = 8;
/// `FI_DOUBLE`.
pub const FI_DOUBLE: i32 = 9;

/// `enum fi_op` values.
#[allow(missing_docs)]
pub mod op {
    pub const MIN: i32 = 0;
    pub const MAX: i32 = 1;
    pub const SUM: i32 = 2;
    pub const PROD: i32 = 3;
    pub const LOR: i32 = 4;
    pub const LAND: i32 = 5;
    pub const BOR: i32 = 6;
    pub const BAND: i32 = 7;
    pub const LXOR: i32 = 8;
    pub const BXOR: i32 = 9;
    pub const READ: i32 = 10;
    pub const WRITE: i32 = 11;
    pub const CSWAP: i32 = 12;
    pub const CSWAP_NE: i32 = 13;
    pub const CSWAP_LE: i32 = 14;
    pub const CSWAP_LT: i32 = 15;
    pub const CSWAP_GE: i32 = 16;
    pub const CSWAP_GT: i32 = 17;
    pub const MSWAP: i32 = 18;
}

/// The three forms of atomic call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// `fi_atomic`: change the target, return nothing.
    Write,
    /// `fi_fetch_atomic`: change it, return what it was.
    Fetch,
    /// `fi_compare_atomic`: change it if a comparison holds, return what it was.
    Compare,
}

impl Form {
    /// Its number on the wire and across the C boundary.
    pub fn code(self) -> u8 {
        match self {
            Form::Write => 0,
            Form::Fetch => 1,
            Form::Compare => 2,
        }
    }

    /// From its number.
    pub fn from_code(c: u8) -> Option<Form> {
        Some(match c {
            0 => Form::Write,
            1 => Form::Fetch,
            2 => Form::Compare,
            _ => return None,
        })
    }
}

/// Bytes of one element of `dt`, if the provider handles `dt`.
pub fn elem_bytes(dt: i32) -> Option<usize> {
    match dt {
        0 | 1 => Some(1),
        2 | 3 => Some(2),
        4 | 5 | FI_FLOAT => Some(4),
        6 | 7 | FI_DOUBLE => Some(8),
        _ => None,
    }
}

/// Elements one atomic call carries at most: its operands, compare values and the old
/// values sent back each fit in one fabric message.
pub fn count_max(dt: i32) -> usize {
    elem_bytes(dt).map_or(0, |b| crate::wire::FRAGMENT_BYTES_MAX / 2 / b)
}

/// Whether the provider does `op` on `dt` in `form` (what `fi_atomicvalid` and friends
/// answer).
pub fn valid(dt: i32, op: i32, form: Form) -> bool {
    let Some(_) = elem_bytes(dt) else { return false };
    let int = (FI_INT8..=FI_UINT64).contains(&dt);
    let arith = matches!(op, op::MIN | op::MAX | op::SUM | op::PROD);
    let bits = matches!(op, op::LOR | op::LAND | op::BOR | op::BAND | op::LXOR | op::BXOR);
    match form {
        Form::Write => arith || (bits && int) || op == op::WRITE,
        Form::Fetch => arith || (bits && int) || op == op::WRITE || op == op::READ,
        Form::Compare => matches!(op, op::CSWAP..=op::CSWAP_GT) || (op == op::MSWAP && int),
    }
}

/// An element as the arithmetic sees it.
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd)]
enum Num {
    I(i64),
    U(u64),
    F(f64),
}

fn load(dt: i32, b: &[u8]) -> Num {
    let a = |n: usize| -> [u8; 8] {
        let mut x = [0u8; 8];
        x[..n].copy_from_slice(&b[..n]);
        x
    };
    match dt {
        0 => Num::I(i64::from(b[0] as i8)),
        1 => Num::U(u64::from(b[0])),
        2 => Num::I(i64::from(i16::from_le_bytes([b[0], b[1]]))),
        3 => Num::U(u64::from(u16::from_le_bytes([b[0], b[1]]))),
        4 => Num::I(i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
        5 => Num::U(u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
        6 => Num::I(i64::from_le_bytes(a(8))),
        7 => Num::U(u64::from_le_bytes(a(8))),
        FI_FLOAT => Num::F(f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
        _ => Num::F(f64::from_le_bytes(a(8))),
    }
}

fn store(dt: i32, v: Num, out: &mut [u8]) {
    let bits = match v {
        Num::I(i) => i as u64,
        Num::U(u) => u,
        Num::F(f) if dt == FI_FLOAT => u64::from((f as f32).to_bits()),
        Num::F(f) => f.to_bits(),
    };
    let n = out.len();
    out.copy_from_slice(&bits.to_le_bytes()[..n]);
}

fn bits_of(v: Num) -> u64 {
    match v {
        Num::I(i) => i as u64,
        Num::U(u) => u,
        Num::F(f) => f.to_bits(),
    }
}

fn truthy(v: Num) -> bool {
    bits_of(v) != 0
}

/// The new value of an element that is `t`, given operand `o` and compare value `c`; `None`
/// leaves it as it is.
fn apply(op: i32, t: Num, o: Num, c: Num) -> Option<Num> {
    let same = |x: u64| match t {
        Num::I(_) => Num::I(x as i64),
        Num::U(_) => Num::U(x),
        Num::F(_) => Num::F(f64::from_bits(x)),
    };
    let flag = |b: bool| same(u64::from(b));
    Some(match op {
        op::MIN => {
            if o < t {
                o
            } else {
                t
            }
        }
        op::MAX => {
            if o > t {
                o
            } else {
                t
            }
        }
        op::SUM => match (t, o) {
            (Num::I(a), Num::I(b)) => Num::I(a.wrapping_add(b)),
            (Num::U(a), Num::U(b)) => Num::U(a.wrapping_add(b)),
            (Num::F(a), Num::F(b)) => Num::F(a + b),
            _ => return None,
        },
        op::PROD => match (t, o) {
            (Num::I(a), Num::I(b)) => Num::I(a.wrapping_mul(b)),
            (Num::U(a), Num::U(b)) => Num::U(a.wrapping_mul(b)),
            (Num::F(a), Num::F(b)) => Num::F(a * b),
            _ => return None,
        },
        op::LOR => flag(truthy(t) || truthy(o)),
        op::LAND => flag(truthy(t) && truthy(o)),
        op::LXOR => flag(truthy(t) ^ truthy(o)),
        op::BOR => same(bits_of(t) | bits_of(o)),
        op::BAND => same(bits_of(t) & bits_of(o)),
        op::BXOR => same(bits_of(t) ^ bits_of(o)),
        op::READ => return None,
        op::WRITE => o,
        op::CSWAP if c == t => o,
        op::CSWAP_NE if c != t => o,
        op::CSWAP_LE if c <= t => o,
        op::CSWAP_LT if c < t => o,
        op::CSWAP_GE if c >= t => o,
        op::CSWAP_GT if c > t => o,
        op::MSWAP => same((bits_of(o) & bits_of(c)) | (bits_of(t) & !bits_of(c))),
        _ => return None,
    })
}

/// Carry out `op` on `dt` over the elements in `target` (changed in place) with `operands`
/// and, for the compare form, `compares`; the old values. The slices are whole elements
/// (checked by the caller against [`elem_bytes`]).
pub fn run(dt: i32, op: i32, target: &mut [u8], operands: &[u8], compares: &[u8]) -> Vec<u8> {
    let size = elem_bytes(dt).unwrap_or(1);
    let old = target.to_vec();
    for (i, t) in target.chunks_mut(size).enumerate() {
        let at = i * size..(i + 1) * size;
        let tv = load(dt, t);
        let o = operands.get(at.clone()).map_or(tv, |b| load(dt, b));
        let c = compares.get(at).map_or(tv, |b| load(dt, b));
        if let Some(v) = apply(op, tv, o, c) {
            store(dt, v, t);
        }
    }
    old
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u64s(v: &[u64]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    // Checks what each form's operations do to 64-bit unsigned elements against the
    // definitions in fi_atomic(3): sums wrap, min and max, the bitwise and logical ops, a
    // write, compare-and-swap only where the comparison holds, a masked swap; the old values
    // come back; and which pairs are valid in which form (no bitwise ops on floats, no read
    // in the write form, no compares outside the compare form).
    #[test]
    fn operations_do_what_libfabric_says() {
        let mut t = u64s(&[5, u64::MAX, 0b1100]);
        let old = run(7, op::SUM, &mut t, &u64s(&[1, 1, 1]), &[]);
        assert_eq!((t.clone(), old), (u64s(&[6, 0, 0b1101]), u64s(&[5, u64::MAX, 0b1100])));
        run(7, op::MIN, &mut t, &u64s(&[3, 9, 100]), &[]);
        assert_eq!(t, u64s(&[3, 0, 0b1101]));
        run(7, op::BAND, &mut t, &u64s(&[1, 1, 0b0101]), &[]);
        assert_eq!(t, u64s(&[1, 0, 0b0101]));
        run(7, op::LOR, &mut t, &u64s(&[0, 0, 0]), &[]);
        assert_eq!(t, u64s(&[1, 0, 1]));
        run(7, op::CSWAP, &mut t, &u64s(&[42, 43, 44]), &u64s(&[1, 9, 1]));
        assert_eq!(t, u64s(&[42, 0, 44]), "swapped only where compare equalled the target");
        run(7, op::MSWAP, &mut t, &u64s(&[0xff, 0, 0]), &u64s(&[0x0f, 0, 0]));
        assert_eq!(t, u64s(&[(42 & !0x0f) | 0x0f, 0, 44]));
        let mut d = 1.5f64.to_le_bytes().to_vec();
        run(FI_DOUBLE, op::PROD, &mut d, &2.0f64.to_le_bytes(), &[]);
        assert_eq!(f64::from_le_bytes(d[..8].try_into().unwrap()), 3.0);
        let mut i = (-3i32).to_le_bytes().to_vec();
        run(4, op::MAX, &mut i, &(-7i32).to_le_bytes(), &[]);
        assert_eq!(i32::from_le_bytes(i[..4].try_into().unwrap()), -3, "signed comparison");
        assert!(
            valid(7, op::SUM, Form::Write) && valid(7, op::READ, Form::Fetch) && valid(9, op::CSWAP, Form::Compare)
        );
        assert!(
            !valid(9, op::BOR, Form::Write) && !valid(7, op::READ, Form::Write) && !valid(7, op::CSWAP, Form::Fetch)
        );
        assert!(!valid(12, op::SUM, Form::Write), "long double is not handled");
    }
}
