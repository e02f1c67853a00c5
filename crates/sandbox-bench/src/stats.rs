//! Sample statistics: median and p90 of a set of measurements.

use serde::Serialize;

/// Median and p90 of one series of samples (in the series' unit).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Summary {
    /// The median (mean of the two middle values for an even count).
    pub median: f64,
    /// The 90th percentile, nearest rank (`ceil(0.9 n)`-th smallest).
    pub p90: f64,
    /// Number of samples.
    pub n: usize,
}

/// The median of `values`; `None` when empty. NaNs are ignored.
pub fn median(values: &[f64]) -> Option<f64> {
    let v = sorted(values);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// The `q`-quantile (0 < q ≤ 1) by nearest rank; `None` when empty.
pub fn percentile(values: &[f64], q: f64) -> Option<f64> {
    let v = sorted(values);
    if v.is_empty() {
        return None;
    }
    let rank = (q.clamp(0.0, 1.0) * v.len() as f64).ceil() as usize;
    Some(v[rank.clamp(1, v.len()) - 1])
}

/// Median, p90 and count; `None` when there are no samples.
pub fn summarize(values: &[f64]) -> Option<Summary> {
    Some(Summary {
        median: median(values)?,
        p90: percentile(values, 0.9)?,
        n: values.iter().filter(|v| !v.is_nan()).count(),
    })
}

/// `a / b`, or `None` when either is missing or `b` is not positive.
pub fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 && a.is_finite() && b.is_finite() => Some(a / b),
        _ => None,
    }
}

fn sorted(values: &[f64]) -> Vec<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    v.sort_by(f64::total_cmp);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[7.0]), Some(7.0));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn p90_is_nearest_rank() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.9), Some(9.0));
        let v: Vec<f64> = (1..=30).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.9), Some(27.0));
        assert_eq!(percentile(&[5.0], 0.9), Some(5.0));
        assert_eq!(percentile(&[2.0, 1.0], 0.9), Some(2.0));
        assert_eq!(percentile(&[], 0.9), None);
    }

    #[test]
    fn order_of_input_does_not_matter() {
        let a = [9.0, 1.0, 5.0, 3.0, 7.0];
        let b = [1.0, 3.0, 5.0, 7.0, 9.0];
        assert_eq!(summarize(&a), summarize(&b));
        assert_eq!(summarize(&a).unwrap().n, 5);
    }

    #[test]
    fn nan_samples_are_ignored() {
        assert_eq!(median(&[f64::NAN, 1.0, 3.0]), Some(2.0));
        assert_eq!(summarize(&[f64::NAN]), None);
    }

    #[test]
    fn ratio_guards_zero_and_missing() {
        assert_eq!(ratio(Some(3.0), Some(2.0)), Some(1.5));
        assert_eq!(ratio(Some(3.0), Some(0.0)), None);
        assert_eq!(ratio(None, Some(1.0)), None);
    }
}
