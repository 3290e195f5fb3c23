//! The statistics every bench reports: mean, sample standard deviation, nearest-rank
//! percentiles (the definition the engine's own metrics use, [`areal_core::metrics::percentile`]).

pub(crate) use areal_core::metrics::percentile;

/// Arithmetic mean (0 for no values).
pub(crate) fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len().max(1) as f64
}

/// Sample standard deviation (0 for fewer than two values).
pub(crate) fn sd(xs: &[f64]) -> f64 {
    if xs.len() < 2 {
        return 0.0;
    }
    let m = mean(xs);
    (xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (xs.len() - 1) as f64).sqrt()
}

/// The median (nearest rank).
pub(crate) fn median(xs: &[f64]) -> f64 {
    percentile(xs, 50.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_sd_and_median_of_known_values() {
        let xs = [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0];
        assert_eq!(mean(&xs), 5.0);
        assert!((sd(&xs) - 2.138_089_935).abs() < 1e-9);
        assert_eq!(median(&xs), 4.0);
        assert_eq!((mean(&[]), sd(&[1.0]), median(&[])), (0.0, 0.0, 0.0));
    }
}
