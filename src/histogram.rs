//! Histograms of durations, written where the durations end (the pipeline, sharding) and read
//! by the admin server's scrape. Each observation adds to the one bucket that holds it and the
//! scrape accumulates, so observing costs two atomic additions however many bounds there are.

use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};

/// The upper bounds of a histogram's buckets, in seconds, ascending.
pub trait Bounds<const N: usize> {
    /// The bounds.
    const BOUNDS: [f64; N];
}

/// A histogram over the bounds `B`.
pub struct Histogram<B: Bounds<N>, const N: usize> {
    /// Observations per bucket alone: `own[i]` counts those above the bound before `B::BOUNDS[i]`
    /// and at most it.
    own: [AtomicU64; N],
    /// Observations above every bound (the `+Inf` bucket alone).
    above: AtomicU64,
    /// Sum of the observations, in microseconds.
    sum_micros: AtomicU64,
    bounds: PhantomData<B>,
}

impl<B: Bounds<N>, const N: usize> Default for Histogram<B, N> {
    fn default() -> Self {
        Self {
            own: std::array::from_fn(|_| AtomicU64::new(0)),
            above: AtomicU64::new(0),
            sum_micros: AtomicU64::new(0),
            bounds: PhantomData,
        }
    }
}

impl<B: Bounds<N>, const N: usize> fmt::Debug for Histogram<B, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Histogram")
            .field("buckets", &self.buckets())
            .field("sum_seconds", &self.sum_seconds())
            .finish()
    }
}

impl<B: Bounds<N>, const N: usize> Histogram<B, N> {
    /// Counts one observation, in the first bucket whose bound is at least `seconds`.
    pub fn observe(&self, seconds: f64) {
        let bucket = B::BOUNDS.partition_point(|bound| *bound < seconds);
        self.own
            .get(bucket)
            .unwrap_or(&self.above)
            .fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
    }

    /// Each bucket's upper bound and its own count (not accumulated), `+Inf` last.
    pub fn buckets(&self) -> Vec<(f64, u64)> {
        B::BOUNDS
            .iter()
            .zip(&self.own)
            .chain([(&f64::INFINITY, &self.above)])
            .map(|(bound, n)| (*bound, n.load(Ordering::Relaxed)))
            .collect()
    }

    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.own
            .iter()
            .chain([&self.above])
            .map(|n| n.load(Ordering::Relaxed))
            .sum()
    }

    /// Sum of the observations, in seconds.
    pub fn sum_seconds(&self) -> f64 {
        self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Three;

    impl Bounds<3> for Three {
        const BOUNDS: [f64; 3] = [0.001, 0.01, 1.0];
    }

    #[test]
    fn an_observation_counts_in_the_first_bucket_whose_bound_holds_it() {
        let h = Histogram::<Three, 3>::default();
        // Below the first bound, on a bound, just above one, above every bound.
        for seconds in [0.0, 0.001, 0.0011, 0.01, 0.5, 1.0, 1.5, 90.0] {
            h.observe(seconds);
        }
        assert_eq!(
            h.buckets(),
            [(0.001, 2), (0.01, 2), (1.0, 2), (f64::INFINITY, 2)]
        );
        assert_eq!(h.count(), 8);
        assert!((h.sum_seconds() - 93.0121).abs() < 1e-9, "{h:?}");
    }
}
