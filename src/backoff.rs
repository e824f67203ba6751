//! Exponential backoff with jitter, shared by everything that retries: watches, publishes,
//! Kafka transaction recovery and leader election.

use std::time::{Duration, SystemTime};

/// Exponential backoff from 250 ms to 30 s with jitter, so many watches failing together (an API
/// server restart) do not come back in lockstep.
#[derive(Debug, Default)]
pub struct Backoff {
    attempt: u32,
}

impl Backoff {
    /// The next delay.
    pub fn next_delay(&mut self) -> Duration {
        let base_ms = 250u64.saturating_mul(1 << self.attempt.min(7)).min(30_000);
        self.attempt = self.attempt.saturating_add(1);
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let jitter = u64::from(nanos) % (base_ms / 4 + 1);
        Duration::from_millis(base_ms - base_ms / 8 + jitter)
    }

    /// Back to the shortest delay after a success.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_caps() {
        let mut b = Backoff::default();
        let first = b.next_delay();
        assert!(
            first >= Duration::from_millis(218) && first <= Duration::from_millis(300),
            "{first:?}"
        );
        for _ in 0..20 {
            b.next_delay();
        }
        let capped = b.next_delay();
        assert!(
            capped <= Duration::from_millis(30_000 + 7_500)
                && capped >= Duration::from_millis(26_000),
            "{capped:?}"
        );
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(300));
    }
}
