//! The bridge's Kafka producer: librdkafka's `BaseProducer` as the rdkafka crate publishes it,
//! with a thread of the bridge serving its delivery reports, and the bridge deciding how a flush
//! and a commit wait ([`native`]).
//!
//! rdkafka's own `ThreadedProducer` (and so its `FutureProducer`) flushes by polling the queue
//! its polling thread polls, for up to 100 ms whenever that thread serves the last delivery
//! report first, and asks librdkafka to flush with a zero timeout, under which `linger.ms`
//! still applies; its commit flushes that way first. Here a flush is librdkafka's own, waiting
//! for this thread to serve the reports, with `linger.ms` ignored while it runs.

mod native;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use futures::channel::oneshot;
use rdkafka::ClientConfig;
use rdkafka::client::{Client, ClientContext};
use rdkafka::config::FromClientConfigAndContext;
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::{DeliveryResult, Message, ToBytes};
use rdkafka::producer::future_producer::{Delivery, OwnedDeliveryResult};
use rdkafka::producer::{BaseProducer, BaseRecord, FutureRecord, Producer as _, ProducerContext};
use tracing::warn;

/// How long one call of the polling thread waits for delivery reports; the thread stops at most
/// this long after the last handle is dropped. The crate's poll hands librdkafka whole
/// milliseconds (truncated) and then spins until its deadline, so an idle call would spin
/// through the partial millisecond left after its last wait: a second and 50 µs leaves a
/// remainder that the wake-up's own delay mostly covers.
const POLL_FOR: Duration = Duration::from_micros(1_000_050);

/// A record's fate: the broker's acknowledgement, or the error and the record. `Canceled` when
/// the producer was destroyed first.
pub(super) type DeliveryFuture = oneshot::Receiver<OwnedDeliveryResult>;

/// A Kafka producer (a cheap handle; the last one dropped stops its polling thread, which then
/// destroys the producer).
#[derive(Clone)]
pub(super) struct Producer {
    shared: Arc<Shared>,
}

struct Shared {
    base: Arc<BaseProducer<Reports>>,
    stop: Arc<AtomicBool>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// The producer's context: hands each delivery report to the record's [`DeliveryFuture`] (and
/// logs librdkafka's lines as the crate's default context does).
pub(super) struct Reports;

impl ClientContext for Reports {}

impl ProducerContext for Reports {
    type DeliveryOpaque = Box<oneshot::Sender<OwnedDeliveryResult>>;

    fn delivery(&self, result: &DeliveryResult<'_>, to: Self::DeliveryOpaque) {
        let owned = match result {
            Ok(m) => Ok(Delivery {
                partition: m.partition(),
                offset: m.offset(),
                timestamp: m.timestamp(),
            }),
            Err((e, m)) => Err((e.clone(), m.detach())),
        };
        // The sender may have stopped waiting: nothing to tell.
        let _ = to.send(owned);
    }
}

impl Producer {
    /// Creates the producer and starts its polling thread.
    pub(super) fn create(settings: &ClientConfig) -> KafkaResult<Self> {
        let base = Arc::new(BaseProducer::from_config_and_context(settings, Reports)?);
        let stop = Arc::new(AtomicBool::new(false));
        let (polled, stopping) = (base.clone(), stop.clone());
        thread::Builder::new()
            .name("kafka-producer".into())
            .spawn(move || {
                while !stopping.load(Ordering::Acquire) {
                    polled.poll(POLL_FOR);
                }
            })
            .map_err(|e| {
                warn!(error = %e, "cannot start a kafka producer's polling thread");
                KafkaError::ClientCreation(e.to_string())
            })?;
        Ok(Self {
            shared: Arc::new(Shared { base, stop }),
        })
    }

    fn base(&self) -> &BaseProducer<Reports> {
        &self.shared.base
    }

    /// Hands a record to librdkafka; the record comes back with the error if it was refused
    /// (`QueueFull` among others).
    #[allow(clippy::result_large_err)]
    pub(super) fn send_result<'a, K, P>(
        &self,
        record: FutureRecord<'a, K, P>,
    ) -> Result<DeliveryFuture, (KafkaError, FutureRecord<'a, K, P>)>
    where
        K: ToBytes + ?Sized,
        P: ToBytes + ?Sized,
    {
        let (to, delivery) = oneshot::channel();
        let FutureRecord {
            topic,
            partition,
            payload,
            key,
            timestamp,
            headers,
        } = record;
        let base = BaseRecord {
            topic,
            partition,
            payload,
            key,
            timestamp,
            headers,
            delivery_opaque: Box::new(to),
        };
        self.base().send(base).map(|()| delivery).map_err(|(e, r)| {
            let back = FutureRecord {
                topic: r.topic,
                partition: r.partition,
                payload: r.payload,
                key: r.key,
                timestamp: r.timestamp,
                headers: r.headers,
            };
            (e, back)
        })
    }

    /// Waits (blocking) until every record is acknowledged or failed and its report served, or
    /// `timeout` has passed; librdkafka sends what it holds at once meanwhile.
    pub(super) fn flush(&self, timeout: Duration) -> KafkaResult<()> {
        native::flush(self.base(), timeout)
    }

    /// `init_transactions` (blocking).
    pub(super) fn init_transactions(&self, timeout: Duration) -> KafkaResult<()> {
        self.base().init_transactions(timeout)
    }

    /// `begin_transaction`.
    pub(super) fn begin_transaction(&self) -> KafkaResult<()> {
        self.base().begin_transaction()
    }

    /// Flushes (as [`Producer::flush`]) and commits the open transaction (blocking).
    pub(super) fn commit_transaction(&self, timeout: Duration) -> KafkaResult<()> {
        native::commit_transaction(self.base(), timeout)
    }

    /// Aborts the open transaction (blocking).
    pub(super) fn abort_transaction(&self, timeout: Duration) -> KafkaResult<()> {
        self.base().abort_transaction(timeout)
    }

    /// The client, for its fatal error and metadata.
    pub(super) fn client(&self) -> &Client<Reports> {
        self.base().client()
    }
}

#[cfg(test)]
mod tests {
    //! Against librdkafka's mock cluster.

    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use rdkafka::ClientConfig;
    use rdkafka::mocking::MockCluster;
    use rdkafka::producer::{DefaultProducerContext, FutureRecord};

    use super::Producer;

    const TOPIC: &str = "events";

    /// A producer that would hold every record for 30 s unless flushed.
    fn lingering(cluster: &MockCluster<'static, DefaultProducerContext>) -> Producer {
        let mut settings = ClientConfig::new();
        settings
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .set("linger.ms", "30000");
        Producer::create(&settings).unwrap()
    }

    fn cluster() -> MockCluster<'static, DefaultProducerContext> {
        let cluster = MockCluster::new(1).unwrap();
        cluster.create_topic(TOPIC, 1, 1).unwrap();
        cluster
    }

    /// Sends one record, then runs `end` (a flush or a commit) on a blocking thread; the
    /// record's fate.
    async fn send_then(
        producer: &Producer,
        end: impl FnOnce(Producer) -> rdkafka::error::KafkaResult<()> + Send + 'static,
    ) -> super::OwnedDeliveryResult {
        let record = FutureRecord::to(TOPIC).key("k").payload("v");
        let delivery = producer.send_result(record).map_err(|(e, _)| e).unwrap();
        let ending = producer.clone();
        tokio::task::spawn_blocking(move || end(ending))
            .await
            .unwrap()
            .unwrap();
        delivery.await.unwrap()
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_flush_sends_what_the_producer_lingers_on_and_the_thread_serves_its_report() {
        let cluster = cluster();
        let producer = lingering(&cluster);
        // Within a fifth of the linger: the flush sends at once and returns when the report
        // is served, by the polling thread.
        let delivered = send_then(&producer, |p| p.flush(Duration::from_secs(6))).await;
        assert_eq!(delivered.unwrap().offset, 0);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_commit_sends_the_lingering_records_of_its_transaction() {
        let cluster = cluster();
        let mut settings = ClientConfig::new();
        settings
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .set("linger.ms", "30000")
            .set("transactional.id", "kube-event-bridge.producer-test");
        let producer = Producer::create(&settings).unwrap();
        let starting = producer.clone();
        tokio::task::spawn_blocking(move || {
            starting.init_transactions(Duration::from_secs(10))?;
            starting.begin_transaction()
        })
        .await
        .unwrap()
        .unwrap();
        let committed =
            send_then(&producer, |p| p.commit_transaction(Duration::from_secs(6))).await;
        assert!(committed.is_ok());
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_refused_record_comes_back_whole() {
        let cluster = cluster();
        let mut settings = ClientConfig::new();
        settings
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .set("message.max.bytes", "1000");
        let producer = Producer::create(&settings).unwrap();
        let payload = vec![0u8; 4096];
        let record = FutureRecord::to(TOPIC)
            .key("k")
            .payload(&payload)
            .partition(0);
        let (error, back) = producer.send_result(record).expect_err("refused");
        assert!(error.to_string().contains("too large"), "{error}");
        assert_eq!(
            (back.topic, back.key, back.partition),
            (TOPIC, Some("k"), Some(0))
        );
        assert_eq!(back.payload.map(Vec::len), Some(4096));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn the_last_handle_dropped_stops_the_thread_which_destroys_the_producer() {
        let cluster = cluster();
        let producer = lingering(&cluster);
        // The thread is polling: it served this record's report.
        let delivered = send_then(&producer, |p| p.flush(Duration::from_secs(6))).await;
        delivered.unwrap();
        let base = Arc::downgrade(&producer.shared.base);
        let other = producer.clone();
        drop(producer);
        assert!(base.upgrade().is_some(), "a handle is left");
        drop(other);
        let deadline = Instant::now() + Duration::from_secs(30);
        while base.upgrade().is_some() {
            assert!(
                Instant::now() < deadline,
                "the polling thread kept the producer"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
