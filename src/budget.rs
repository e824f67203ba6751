//! Byte budgets: one per watch (`delivery.maxQueueBytes`) and one for the whole process
//! (`delivery.maxTotalQueueBytes`, every watch of every cluster). Objects a watch has read and the
//! broker has not yet acknowledged (queued between the watch and the pipeline, in flight, or held
//! by an open Kafka transaction) stay under both, so memory follows the configuration whatever the
//! object sizes and however many watches there are, not only the event counts.
//!
//! The watch reserves an object's serialized size and a fixed cost per event ([`charge`]) before
//! queueing it, first in its own budget, then in the process's, and waits while either is spent
//! (backpressure, never loss); the reservation then travels with the object and its event and is
//! given back when they are dropped: settled, committed, filtered or suppressed. An object larger
//! than a whole budget still passes, alone.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DynamicObject, TypeMeta};
use serde_json::Value;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::Instant;

use crate::tasks::Tasks;

/// Budget granularity: sizes are counted in KiB, rounded up.
const UNIT: usize = 1024;

/// A byte budget: a watch's own, or the process's that every watch's draws on too.
#[derive(Debug, Clone)]
pub struct Budget {
    semaphore: Arc<Semaphore>,
    units: u32,
    /// The process's budget, drawn on after this one.
    total: Option<Arc<Budget>>,
    /// Nanoseconds reservations waited for room in this budget (in the process's: how long
    /// watches were held back by the other watches' bytes), counted as each wait ends.
    waited: Arc<AtomicU64>,
    /// Reservations waiting for room now.
    waiting: Arc<AtomicUsize>,
    /// Told when reservations begin to wait, none having waited before ([`Budget::starving`]).
    began_waiting: Arc<Notify>,
}

/// Counts one reservation in [`Budget::waiting`] while it lives (a wait cancelled included).
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn start(count: &'a AtomicUsize, began: &Notify) -> Self {
        if count.fetch_add(1, Ordering::SeqCst) == 0 {
            began.notify_waiters();
        }
        Self(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Bytes reserved in a [`Budget`] (and the process's), given back on drop.
#[derive(Debug)]
pub struct Reservation {
    _own: Option<OwnedSemaphorePermit>,
    _total: Option<OwnedSemaphorePermit>,
}

impl Reservation {
    /// A reservation of nothing (for what is not read from the API server).
    pub fn none() -> Self {
        Self {
            _own: None,
            _total: None,
        }
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
            total: None,
            waited: Arc::default(),
            waiting: Arc::default(),
            began_waiting: Arc::default(),
        }
    }

    /// A watch's budget of `max_bytes` whose reservations also draw on the process's `total`.
    pub fn within(max_bytes: usize, total: &Budget) -> Self {
        Self {
            total: Some(Arc::new(total.clone())),
            ..Self::new(max_bytes)
        }
    }

    /// Waits until `bytes` fit here and then in the process's budget (an object larger than a
    /// whole budget waits for all of it). The watch's own comes first: a watch waiting for its
    /// own room holds none of the room the other watches share.
    pub async fn reserve(&self, bytes: usize) -> Reservation {
        let own = self.permit(bytes).await;
        let total = match &self.total {
            Some(total) => Some(total.permit(bytes).await),
            None => None,
        };
        Reservation {
            _own: Some(own),
            _total: total,
        }
    }

    /// The permit for `bytes` in this budget alone, counting the time it waited for room.
    async fn permit(&self, bytes: usize) -> OwnedSemaphorePermit {
        let wanted = u32::try_from(bytes.div_ceil(UNIT))
            .unwrap_or(u32::MAX)
            .clamp(1, self.units);
        // Queued in turn from the first poll (a reservation is never overtaken by later ones);
        // only a wait past that first poll is counted.
        let mut acquire = std::pin::pin!(self.semaphore.clone().acquire_many_owned(wanted));
        if let std::task::Poll::Ready(permit) = futures::poll!(&mut acquire) {
            return permit.expect("the budget's semaphore is never closed");
        }
        let since = Instant::now();
        let waiting = Waiting::start(&self.waiting, &self.began_waiting);
        let permit = acquire
            .await
            .expect("the budget's semaphore is never closed");
        drop(waiting);
        let nanos = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.waited.fetch_add(nanos, Ordering::Relaxed);
        permit
    }

    /// Bytes reserved now (rounded to units).
    pub fn reserved_bytes(&self) -> usize {
        (self.units as usize - self.semaphore.available_permits()) * UNIT
    }

    /// The budget's size (rounded to units).
    pub fn max_bytes(&self) -> usize {
        self.units as usize * UNIT
    }

    /// Reservations waiting for room in this budget now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Whether reservations wait for room now, in this budget or in the process's it draws on:
    /// what is reserved keeps a watch from reading on.
    pub fn starved(&self) -> bool {
        self.waiting() > 0 || self.total.as_ref().is_some_and(|total| total.waiting() > 0)
    }

    /// Returns once reservations wait for room ([`Budget::starved`]): at once if they do now.
    pub async fn starving(&self) {
        let mut own = std::pin::pin!(self.began_waiting.notified());
        let mut total = std::pin::pin!(
            self.total
                .as_ref()
                .map(|total| total.began_waiting.notified())
        );
        // Registered before the check, so that a wait beginning after it is not missed.
        own.as_mut().enable();
        if let Some(total) = total.as_mut().as_pin_mut() {
            total.enable();
        }
        if self.starved() {
            return;
        }
        let total = async {
            match total.as_pin_mut() {
                Some(total) => total.await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = own => {}
            () = total => {}
        }
    }

    /// Seconds reservations have waited for room in this budget, all together (each wait
    /// counted once it ends).
    pub fn waited_secs(&self) -> f64 {
        self.waited.load(Ordering::Relaxed) as f64 / 1e9
    }
}

/// Forwards what arrives on `rx` to a channel of `capacity`, each item with its reservation of
/// `size(item)` bytes, taken before it is queued: while the budget is spent, forwarding waits, and
/// so does the sender behind `rx` once its own (small) channel is full. The forwarder is one of
/// `tasks`; it ends when `rx` closes or the receiver is dropped.
pub fn metered<T: Send + 'static>(
    mut rx: mpsc::Receiver<T>,
    capacity: usize,
    budget: Budget,
    size: fn(&T) -> usize,
    tasks: &Tasks,
) -> mpsc::Receiver<(T, Reservation)> {
    let (tx, out) = mpsc::channel(capacity);
    tasks.spawn("queue budget", async move {
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

/// What an object's event holds in memory beyond the object's serialized size, while it is
/// queued or awaits the broker: the parsed object's maps and strings, the encoded event and the
/// broker client's copy of it. A small object's JSON is a fraction of that, so counting its JSON
/// alone let a budget hold several times its size in small objects (docs/benchmarks.md, "A
/// million objects over 1,000 watches").
pub const EVENT_BYTES: usize = 4 * UNIT;

/// What `object` is charged in the budgets: its serialized size ([`object_size`]) and
/// [`EVENT_BYTES`].
pub fn charge(object: &DynamicObject) -> usize {
    object_size(object) + EVENT_BYTES
}

/// The size of `object` serialized as JSON, as [`serialized_size`] counts it, without running
/// the serializer over its content: every field but `apiVersion`, `kind` and `metadata` is
/// measured by [`json_len`], which scans strings eight bytes at a time for the few characters
/// JSON escapes. That content is most of an object, and serializing it only to count its bytes
/// was a visible share of the bridge's CPU per event.
pub fn object_size(object: &DynamicObject) -> usize {
    /// What `DynamicObject` serializes before its flattened content.
    #[derive(serde::Serialize)]
    struct Head<'a> {
        #[serde(flatten)]
        types: &'a Option<TypeMeta>,
        metadata: &'a ObjectMeta,
    }
    let Value::Object(content) = &object.data else {
        return serialized_size(object);
    };
    let head = serialized_size(&Head {
        types: &object.types,
        metadata: &object.metadata,
    });
    // Each entry follows `metadata` (always written), so each adds a comma.
    head + content
        .iter()
        .map(|(key, value)| 1 + string_len(key) + 1 + json_len(value))
        .sum::<usize>()
}

/// The length of `value` as `serde_json` writes it (compact), computed without writing it.
fn json_len(value: &Value) -> usize {
    match value {
        Value::Null | Value::Bool(true) => 4,
        Value::Bool(false) => 5,
        Value::Number(n) => serialized_size(n),
        Value::String(s) => string_len(s),
        Value::Array(items) => {
            2 + items.len().saturating_sub(1) + items.iter().map(json_len).sum::<usize>()
        }
        Value::Object(entries) => {
            2 + entries.len().saturating_sub(1)
                + entries
                    .iter()
                    .map(|(key, value)| string_len(key) + 1 + json_len(value))
                    .sum::<usize>()
        }
    }
}

/// The length of `s` as a JSON string: quotes, and the escapes `serde_json` writes (`\"`, `\\`
/// and the control characters: `\n` and the like, else `\u00XX`).
fn string_len(s: &str) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let has_zero = |w: u64| w.wrapping_sub(ONES) & !w & HIGH != 0;
    // Whether a byte of `w` is below 0x20, a quote or a backslash (exact per word).
    let escapes = |w: u64| {
        w.wrapping_sub(ONES * 0x20) & !w & HIGH != 0
            || has_zero(w ^ (ONES * u64::from(b'"')))
            || has_zero(w ^ (ONES * u64::from(b'\\')))
    };
    let extra = |bytes: &[u8]| -> usize {
        bytes
            .iter()
            .map(|b| match b {
                b'"' | b'\\' | 0x08 | 0x09 | 0x0a | 0x0c | 0x0d => 1,
                0..=0x1f => 5,
                _ => 0,
            })
            .sum()
    };
    let mut chunks = s.as_bytes().chunks_exact(8);
    let mut len = 2 + s.len();
    for chunk in &mut chunks {
        if escapes(u64::from_le_bytes(chunk.try_into().expect("8 bytes"))) {
            len += extra(chunk);
        }
    }
    len + extra(chunks.remainder())
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
    use proptest::prelude::any;

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
    async fn a_watch_waits_while_the_other_watches_spend_the_process_budget() {
        let total = Budget::new(8 * UNIT);
        let (a, b) = (
            Budget::within(10 * UNIT, &total),
            Budget::within(10 * UNIT, &total),
        );
        let first = a.reserve(6 * UNIT).await;
        assert_eq!(
            (a.reserved_bytes(), total.reserved_bytes()),
            (6 * UNIT, 6 * UNIT)
        );
        let other = b.clone();
        let mut second = tokio::spawn(async move { other.reserve(4 * UNIT).await });
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        assert!(
            futures::poll!(&mut second).is_pending(),
            "b has room of its own but the process has 2 KiB left: it waits"
        );
        assert_eq!(total.waiting(), 1);
        assert!(
            a.starved() && b.starved(),
            "a's reservation keeps b from reading on"
        );
        assert_eq!(b.reserved_bytes(), 4 * UNIT, "b's own room is taken first");
        drop(first);
        let _second = second.await.unwrap();
        assert!(!a.starved() && !b.starved());
        assert_eq!(total.reserved_bytes(), 4 * UNIT);
        assert_eq!(a.reserved_bytes(), 0);
        assert!(
            total.waited_secs() >= 1.0,
            "the wait is counted on the process's budget: {}",
            total.waited_secs()
        );
        assert!(b.waited_secs() == 0.0, "b never waited for its own room");
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_is_told_when_another_begins_to_wait_for_the_process_budget() {
        let total = Budget::new(8 * UNIT);
        let (a, b) = (
            Budget::within(10 * UNIT, &total),
            Budget::within(10 * UNIT, &total),
        );
        let held = a.reserve(6 * UNIT).await;
        let watching = a.clone();
        let mut told = tokio::spawn(async move { watching.starving().await });
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        assert!(futures::poll!(&mut told).is_pending(), "nobody waits yet");
        let other = b.clone();
        let waiting = tokio::spawn(async move { other.reserve(4 * UNIT).await });
        tokio::time::timeout(std::time::Duration::from_secs(1), told)
            .await
            .expect("told once b waits")
            .unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(1), a.starving())
            .await
            .expect("at once while b still waits");
        drop(held);
        let _room = waiting.await.unwrap();
        let own = Budget::new(4 * UNIT);
        let _all = own.reserve(4 * UNIT).await;
        let mut alone = std::pin::pin!(own.starving());
        assert!(futures::poll!(&mut alone).is_pending());
        let more = own.clone();
        let _blocked = tokio::spawn(async move { more.reserve(UNIT).await });
        tokio::time::timeout(std::time::Duration::from_secs(1), alone)
            .await
            .expect("a wait for a budget's own room tells it too");
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_waiting_for_its_own_room_holds_none_of_the_process_budget() {
        let total = Budget::new(10 * UNIT);
        let (a, b) = (
            Budget::within(4 * UNIT, &total),
            Budget::within(10 * UNIT, &total),
        );
        let _held = a.reserve(4 * UNIT).await;
        let waiting = a.clone();
        let mut blocked = tokio::spawn(async move { waiting.reserve(4 * UNIT).await });
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        assert!(futures::poll!(&mut blocked).is_pending());
        let taken =
            tokio::time::timeout(std::time::Duration::from_secs(1), b.reserve(6 * UNIT)).await;
        assert!(
            taken.is_ok(),
            "the 6 KiB a's waiting reservation does not hold are b's to take"
        );
        assert_eq!(total.reserved_bytes(), 10 * UNIT);
        assert_eq!((a.waiting(), total.waiting()), (1, 0));
        assert!(a.starved() && !b.starved(), "only a's own room is spent");
        assert!(total.waited_secs() == 0.0);
        blocked.abort();
        let _ = blocked.await;
        assert_eq!(a.waiting(), 0, "a cancelled wait is no longer counted");
    }

    #[tokio::test]
    async fn an_object_larger_than_the_process_budget_passes_alone() {
        let total = Budget::new(4 * UNIT);
        let watch = Budget::within(64 * UNIT, &total);
        let huge = watch.reserve(20 * UNIT).await;
        assert_eq!(
            (watch.reserved_bytes(), total.reserved_bytes()),
            (20 * UNIT, 4 * UNIT)
        );
        drop(huge);
        assert_eq!(total.reserved_bytes(), 0);
        assert_eq!(total.max_bytes(), 4 * UNIT);
    }

    #[tokio::test(start_paused = true)]
    async fn metered_items_wait_while_the_budget_is_spent() {
        let (tx, rx) = mpsc::channel::<usize>(1);
        let budget = Budget::new(8 * UNIT);
        let mut out = metered(rx, 100, budget.clone(), |n| *n, &Tasks::default());
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

    /// Small objects are charged what their events hold, not only their JSON: a budget of 64 KiB
    /// lets a dozen ConfigMaps of a hundred bytes through before it waits, not hundreds.
    #[tokio::test(start_paused = true)]
    async fn small_objects_are_charged_their_events_cost() {
        let object: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cm-000001", "namespace": "a", "uid": "u", "resourceVersion": "7"},
            "data": {"k": "v".repeat(64)},
        }))
        .unwrap();
        assert!(object_size(&object) < 256, "{}", object_size(&object));
        assert_eq!(charge(&object), object_size(&object) + EVENT_BYTES);
        let (tx, rx) = mpsc::channel(1);
        let mut out = metered(rx, 1000, Budget::new(64 * UNIT), charge, &Tasks::default());
        tokio::spawn(async move { while tx.send(object.clone()).await.is_ok() {} });
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let mut passed = Vec::new();
        while let Ok(item) = out.try_recv() {
            passed.push(item);
        }
        assert_eq!(
            passed.len(),
            64 * UNIT / (EVENT_BYTES + UNIT),
            "{}",
            passed.len()
        );
    }

    #[test]
    fn serialized_size_is_the_json_length() {
        let v = serde_json::json!({"a": "bc", "d": [1, 2]});
        assert_eq!(serialized_size(&v), serde_json::to_vec(&v).unwrap().len());
    }

    /// Text with what JSON escapes in and around eight-byte words.
    fn text() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            any::<String>(),
            "[\\x00-\\x1f\"\\\\a-z\\x7fé😀]{0,40}",
            "[a-z]{0,20}",
        ]
    }

    /// JSON values of every kind, nested.
    fn value() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            text().prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 64, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map(text(), inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn len(value: &impl serde::Serialize) -> usize {
        serde_json::to_vec(value).unwrap().len()
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        #[test]
        fn json_len_is_the_length_serde_json_writes(v in value()) {
            proptest::prop_assert_eq!(json_len(&v), len(&v));
        }

        #[test]
        fn object_size_is_the_length_serde_json_writes(
            content in proptest::collection::btree_map("[a-z]{1,8}", value(), 0..6),
            typed in any::<bool>(),
            name in text(),
            labels in proptest::collection::btree_map(text(), text(), 0..3),
        ) {
            let object = DynamicObject {
                types: typed.then(|| TypeMeta { api_version: "v1".into(), kind: "ConfigMap".into() }),
                metadata: ObjectMeta {
                    name: Some(name),
                    labels: Some(labels),
                    resource_version: Some("42".into()),
                    ..ObjectMeta::default()
                },
                data: Value::Object(content.into_iter().collect()),
            };
            proptest::prop_assert_eq!(object_size(&object), len(&object));
        }
    }

    #[test]
    fn an_object_whose_content_is_not_a_map_is_counted_by_the_serializer() {
        let object = DynamicObject {
            types: None,
            metadata: ObjectMeta::default(),
            data: Value::Null,
        };
        assert_eq!(object_size(&object), len(&object));
    }
}
