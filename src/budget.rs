//! A byte budget per watch (`delivery.maxQueueBytes`): objects the watch has read and the broker
//! has not yet acknowledged (queued between the watch and the pipeline, in flight, or held by an
//! open Kafka transaction) stay under it, so memory follows the configuration whatever the object
//! sizes, not only the event counts.
//!
//! The watch reserves an object's serialized size before queueing it and waits while the budget
//! is spent (backpressure, never loss); the reservation then travels with the object and its
//! event and is given back when they are dropped: settled, committed, filtered or suppressed. An
//! object larger than the whole budget still passes, alone.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

/// Budget granularity: sizes are counted in KiB, rounded up.
const UNIT: usize = 1024;

/// The budget of one watch.
#[derive(Debug, Clone)]
pub struct Budget {
    semaphore: Arc<Semaphore>,
    units: u32,
}

/// Bytes reserved in a [`Budget`], given back on drop.
#[derive(Debug)]
pub struct Reservation {
    _permit: Option<OwnedSemaphorePermit>,
}

impl Reservation {
    /// A reservation of nothing (for what is not read from the API server).
    pub fn none() -> Self {
        Self { _permit: None }
    }
}

impl Budget {
    /// A budget of `max_bytes` (at least one unit).
    pub fn new(max_bytes: usize) -> Self {
        let units = u32::try_from(max_bytes.div_ceil(UNIT))
            .unwrap_or(u32::MAX)
            .clamp(1, Semaphore::MAX_PERMITS as u32);
        Self {
            semaphore: Arc::new(Semaphore::new(units as usize)),
            units,
        }
    }

    /// Waits until `bytes` fit (an object larger than the whole budget waits for all of it).
    pub async fn reserve(&self, bytes: usize) -> Reservation {
        let wanted = u32::try_from(bytes.div_ceil(UNIT))
            .unwrap_or(u32::MAX)
            .clamp(1, self.units);
        let permit = self
            .semaphore
            .clone()
            .acquire_many_owned(wanted)
            .await
            .expect("the budget's semaphore is never closed");
        Reservation {
            _permit: Some(permit),
        }
    }

    /// Bytes reserved now (rounded to units).
    pub fn reserved_bytes(&self) -> usize {
        (self.units as usize - self.semaphore.available_permits()) * UNIT
    }
}

/// Forwards what arrives on `rx` to a channel of `capacity`, each item with its reservation of
/// `size(item)` bytes, taken before it is queued: while the budget is spent, forwarding waits, and
/// so does the sender behind `rx` once its own (small) channel is full. Ends when `rx` closes or
/// the receiver is dropped.
pub fn metered<T: Send + 'static>(
    mut rx: mpsc::Receiver<T>,
    capacity: usize,
    budget: Budget,
    size: fn(&T) -> usize,
) -> mpsc::Receiver<(T, Reservation)> {
    let (tx, out) = mpsc::channel(capacity);
    tokio::spawn(async move {
        while let Some(item) = rx.recv().await {
            let bytes = size(&item);
            let reservation = if bytes == 0 {
                Reservation::none()
            } else {
                budget.reserve(bytes).await
            };
            if tx.send((item, reservation)).await.is_err() {
                return;
            }
        }
    });
    out
}

/// The size of `value` serialized as JSON, without building the text.
pub fn serialized_size(value: &impl serde::Serialize) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Serializing into a counter cannot fail for JSON values and Kubernetes objects.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn reservations_wait_for_room_and_give_it_back_on_drop() {
        let budget = Budget::new(10 * UNIT);
        let a = budget.reserve(6 * UNIT).await;
        assert_eq!(budget.reserved_bytes(), 6 * UNIT);
        let b = budget.clone();
        let mut second = tokio::spawn(async move { b.reserve(6 * UNIT).await });
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        assert!(
            futures::poll!(&mut second).is_pending(),
            "no room: the second reservation waits"
        );
        drop(a);
        let _second = second.await.unwrap();
        assert_eq!(budget.reserved_bytes(), 6 * UNIT);
    }

    #[tokio::test]
    async fn an_object_larger_than_the_budget_passes_alone() {
        let budget = Budget::new(4 * UNIT);
        let huge = budget.reserve(100 * UNIT).await;
        assert_eq!(budget.reserved_bytes(), 4 * UNIT);
        drop(huge);
        assert_eq!(budget.reserved_bytes(), 0);
        let _small = budget.reserve(1).await;
        assert_eq!(budget.reserved_bytes(), UNIT, "sizes round up to a unit");
    }

    #[tokio::test(start_paused = true)]
    async fn metered_items_wait_while_the_budget_is_spent() {
        let (tx, rx) = mpsc::channel::<usize>(1);
        let budget = Budget::new(8 * UNIT);
        let mut out = metered(rx, 100, budget.clone(), |n| *n);
        for _ in 0..4 {
            tx.send(3 * UNIT).await.unwrap();
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let (first, r1) = out.recv().await.unwrap();
        let (_, r2) = out.recv().await.unwrap();
        assert_eq!(first, 3 * UNIT);
        assert!(
            out.try_recv().is_err(),
            "a third would exceed 8 KiB: it waits for room"
        );
        drop((r1, r2));
        let (_, _r3) = out.recv().await.unwrap();
        let (_, _r4) = out.recv().await.unwrap();
        assert_eq!(budget.reserved_bytes(), 6 * UNIT);
    }

    #[test]
    fn serialized_size_is_the_json_length() {
        let v = serde_json::json!({"a": "bc", "d": [1, 2]});
        assert_eq!(serialized_size(&v), serde_json::to_vec(&v).unwrap().len());
    }
}
