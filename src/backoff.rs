//! The retry policy shared by everything that retries: watches, publishes, announcements,
//! Kafka transaction recovery, leader election, joining the shard, connecting to NATS.
//!
//! The delays and their jitter come from `backon`. An operation retried until it succeeds
//! takes [`policy`] (`backon::Retryable`); a loop that keeps running across successes, and
//! starts its delays over after each, keeps a [`Backoff`]: backon's backoffs are iterators that
//! cannot be rewound, so [`Backoff::reset`] builds a fresh one.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// The first delay before jitter.
const MIN_DELAY: Duration = Duration::from_millis(250);

/// The longest delay before jitter: jitter adds up to as much again, so delays stay under 30 s.
const MAX_DELAY: Duration = Duration::from_secs(15);

/// Delays from 250 ms doubling up to 15 s, each plus a random jitter of up to as much again
/// (250 ms to 30 s in all), for as long as the caller retries; every backoff draws its jitter
/// from a generator seeded apart, so many watches failing together (an API server restart) do
/// not come back in lockstep.
pub const fn policy() -> ExponentialBuilder {
    ExponentialBuilder::new()
        .with_min_delay(MIN_DELAY)
        .with_max_delay(MAX_DELAY)
        .with_jitter()
        .without_max_times()
}

/// The delays of [`policy`] for a loop that retries for as long as it runs, from the shortest
/// again after each success.
#[derive(Debug)]
pub struct Backoff {
    delays: ExponentialBackoff,
}

impl Backoff {
    /// The next delay.
    pub fn next_delay(&mut self) -> Duration {
        // `policy` sets no limit of attempts: the delays never run out.
        self.delays.next().unwrap_or(MAX_DELAY)
    }

    /// Back to the shortest delay after a success.
    pub fn reset(&mut self) {
        *self = Self::default();
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            delays: policy().build(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The range of the delay of attempt `n` (from 0): its base, doubling from 250 ms up to
    /// 15 s, to twice the base (jitter adds less than the base; the bound allows for rounding).
    fn range(n: u32) -> (Duration, Duration) {
        let base = (MIN_DELAY * 2u32.pow(n.min(6))).min(MAX_DELAY);
        (base, base * 2)
    }

    #[test]
    fn delays_double_with_jitter_in_range_and_are_capped() {
        for _ in 0..200 {
            let mut b = Backoff::default();
            for n in 0..12 {
                let delay = b.next_delay();
                let (least, most) = range(n);
                assert!(least <= delay && delay <= most, "attempt {n}: {delay:?}");
                assert!(delay <= Duration::from_secs(30), "attempt {n}: {delay:?}");
            }
        }
    }

    #[test]
    fn the_delays_start_over_after_a_reset() {
        let mut b = Backoff::default();
        for _ in 0..10 {
            b.next_delay();
        }
        b.reset();
        let delay = b.next_delay();
        assert!(delay < Duration::from_millis(500), "{delay:?}");
    }

    #[test]
    fn backoffs_made_at_the_same_instant_spread_out() {
        // Watches failing together start their backoffs together: they must not all wait the
        // same time (a jitter seeded from the clock made them).
        let first: std::collections::BTreeSet<Duration> =
            (0..16).map(|_| Backoff::default().next_delay()).collect();
        assert!(first.len() > 8, "{first:?}");
    }

    #[test]
    fn jitter_covers_its_range() {
        // Over many draws the first delay lands both in the lower and in the upper half of
        // 250 to 500 ms.
        let draws: Vec<Duration> = (0..200).map(|_| Backoff::default().next_delay()).collect();
        assert!(draws.iter().any(|d| *d < Duration::from_millis(375)));
        assert!(draws.iter().any(|d| *d >= Duration::from_millis(375)));
    }
}
