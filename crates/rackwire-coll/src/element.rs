//! Element types of reductions, and the reduction operators.

/// How a reduction combines two elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// Sum (wrapping for integers).
    Sum,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Product (wrapping for integers).
    Prod,
}

impl std::str::FromStr for ReduceOp {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sum" => Ok(ReduceOp::Sum),
            "min" => Ok(ReduceOp::Min),
            "max" => Ok(ReduceOp::Max),
            "prod" | "product" => Ok(ReduceOp::Prod),
            other => Err(format!("unknown reduction {other:?}: use sum, min, max or prod")),
        }
    }
}

/// A type reductions work on: `u32`, `u64`, `i32`, `i64`, `f32`, `f64`. Its bytes travel as
/// they are in memory (every rank of a rack shares one byte order).
pub trait Element: bytemuck::Pod + PartialOrd + Send + Sync + 'static {
    /// Fold `b` into `a` elementwise with `op`.
    fn fold(op: ReduceOp, a: &mut [Self], b: &[Self]);
}

macro_rules! int_element {
    ($($t:ty),*) => {$(
        impl Element for $t {
            fn fold(op: ReduceOp, a: &mut [Self], b: &[Self]) {
                // Each arm is one simple loop the compiler turns into vector instructions.
                match op {
                    ReduceOp::Sum => a.iter_mut().zip(b).for_each(|(x, y)| *x = x.wrapping_add(*y)),
                    ReduceOp::Prod => a.iter_mut().zip(b).for_each(|(x, y)| *x = x.wrapping_mul(*y)),
                    ReduceOp::Min => a.iter_mut().zip(b).for_each(|(x, y)| *x = (*x).min(*y)),
                    ReduceOp::Max => a.iter_mut().zip(b).for_each(|(x, y)| *x = (*x).max(*y)),
                }
            }
        }
    )*};
}
int_element!(u32, u64, i32, i64);

macro_rules! float_element {
    ($($t:ty),*) => {$(
        impl Element for $t {
            fn fold(op: ReduceOp, a: &mut [Self], b: &[Self]) {
                // min and max as in C's fmin/fmax: a NaN loses to a number.
                match op {
                    ReduceOp::Sum => a.iter_mut().zip(b).for_each(|(x, y)| *x += *y),
                    ReduceOp::Prod => a.iter_mut().zip(b).for_each(|(x, y)| *x *= *y),
                    ReduceOp::Min => a.iter_mut().zip(b).for_each(|(x, y)| *x = x.min(*y)),
                    ReduceOp::Max => a.iter_mut().zip(b).for_each(|(x, y)| *x = x.max(*y)),
                }
            }
        }
    )*};
}
float_element!(f32, f64);

#[cfg(test)]
mod tests {
    use super::*;

    // Checks each operator on integers (wrapping, signed) and floats against values worked
    // out by hand, and that operator names parse.
    #[test]
    fn operators_fold_elementwise() {
        let mut a = [1u32, u32::MAX, 7];
        u32::fold(ReduceOp::Sum, &mut a, &[2, 2, 1]);
        assert_eq!(a, [3, 1, 8]);
        let mut a = [-3i64, 5];
        i64::fold(ReduceOp::Min, &mut a, &[2, -9]);
        assert_eq!(a, [-3, -9]);
        let mut a = [1.5f64, -2.0];
        f64::fold(ReduceOp::Prod, &mut a, &[2.0, 3.0]);
        assert_eq!(a, [3.0, -6.0]);
        let mut a = [f32::NAN, 1.0];
        f32::fold(ReduceOp::Max, &mut a, &[4.0, 0.5]);
        assert_eq!(a, [4.0, 1.0]);
        assert_eq!("prod".parse::<ReduceOp>(), Ok(ReduceOp::Prod));
        assert!("avg".parse::<ReduceOp>().is_err());
    }
}
