//! One watch's path to the sink: filter, encode, send in order, and take acknowledgements in
//! order, so the acknowledged position only moves past events the broker has stored.
//!
//! Acknowledgements are handled before new input (a `biased` select), and at most
//! `max_in_flight` events await one, so memory stays bounded while a slow broker applies
//! backpressure all the way to the watch.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::FuturesOrdered;
use futures::{FutureExt, StreamExt};
use tokio::sync::mpsc;
use tracing::{error, info, warn};

use crate::change::ChangeKind;
use crate::encode::{self, ResourceInfo};
use crate::sink::{AnySink, Delivered, Outcome};
use crate::watch::{Backoff, Item};

/// Counters and position of one pipeline, readable from other tasks.
#[derive(Debug, Default)]
pub struct Status {
    /// Events the broker acknowledged.
    pub published: AtomicU64,
    /// Events the broker refused for good.
    pub rejected: AtomicU64,
    /// Changes dropped by the event-type filter.
    pub filtered: AtomicU64,
    /// Changes that could not be encoded.
    pub encode_failed: AtomicU64,
    /// Publish attempts that were retried.
    pub retried: AtomicU64,
    /// Whether the initial list has been published and acknowledged.
    pub synced: AtomicBool,
    acked: std::sync::Mutex<Option<String>>,
}

impl Status {
    /// The resourceVersion up to which every event has been acknowledged.
    pub fn acked_resource_version(&self) -> Option<String> {
        self.acked.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set_acked(&self, rv: String) {
        *self.acked.lock().unwrap_or_else(|e| e.into_inner()) = Some(rv);
    }
}

/// Everything one pipeline needs.
#[derive(Debug, Clone)]
pub struct Pipeline {
    /// Resource-wide event attributes.
    pub info: Arc<ResourceInfo>,
    /// The change kinds to publish.
    pub events: BTreeSet<ChangeKind>,
    /// The sink, shared by every pipeline.
    pub sink: Arc<AnySink>,
    /// Events awaiting acknowledgement at most.
    pub max_in_flight: usize,
    /// Counters and position.
    pub status: Arc<Status>,
}

#[expect(
    clippy::large_enum_variant,
    reason = "moved once; boxing would allocate per event"
)]
enum Done {
    Delivered(Delivered),
    Progress(String),
    Synced,
}

impl Pipeline {
    /// Runs until the watch closes its side of the channel, then drains what is in flight.
    pub async fn run(self, mut rx: mpsc::Receiver<Item>) {
        let mut in_flight: FuturesOrdered<BoxFuture<'static, Done>> = FuturesOrdered::new();
        // For sinks that cannot keep two publishes of one object in order: uids awaiting an ack.
        let mut uids: HashMap<String, u32> = HashMap::new();
        let gate = !self.sink.ordered_in_flight();
        loop {
            tokio::select! {
                biased;
                Some(done) = in_flight.next(), if !in_flight.is_empty() => self.complete(done, &mut uids).await,
                item = rx.recv(), if in_flight.len() < self.max_in_flight => match item {
                    None => break,
                    Some(Item::Progress(rv)) => in_flight.push_back(std::future::ready(Done::Progress(rv)).boxed()),
                    Some(Item::Synced) => in_flight.push_back(std::future::ready(Done::Synced).boxed()),
                    Some(Item::Change(change)) => {
                        if !self.events.contains(&change.kind) {
                            self.status.filtered.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        let event = match encode::encode(&self.info, change) {
                            Ok(e) => e,
                            Err(error) => {
                                self.status.encode_failed.fetch_add(1, Ordering::Relaxed);
                                error!(error = %error, "cannot encode change, skipped");
                                continue;
                            }
                        };
                        if gate {
                            while uids.contains_key(&event.uid) {
                                match in_flight.next().await {
                                    Some(done) => self.complete(done, &mut uids).await,
                                    None => break,
                                }
                            }
                            *uids.entry(event.uid.clone()).or_default() += 1;
                        }
                        let pending = self.sink.send(event).await;
                        in_flight.push_back(pending.map(Done::Delivered).boxed());
                    }
                },
            }
        }
        while let Some(done) = in_flight.next().await {
            self.complete(done, &mut uids).await;
        }
    }

    async fn complete(&self, done: Done, uids: &mut HashMap<String, u32>) {
        match done {
            Done::Progress(rv) => self.status.set_acked(rv),
            Done::Synced => {
                self.status.synced.store(true, Ordering::Relaxed);
                info!("initial state published");
            }
            Done::Delivered(delivered) => {
                let Delivered { event, outcome } = self.retry_until_settled(delivered).await;
                match outcome {
                    Outcome::Acked => {
                        self.status.published.fetch_add(1, Ordering::Relaxed);
                    }
                    Outcome::Rejected { reason, error } => {
                        self.status.rejected.fetch_add(1, Ordering::Relaxed);
                        error!(object = %event.reference(), id = %event.id, bytes = event.data.len(), reason, error = %error, "broker refused event for good, skipped");
                    }
                    Outcome::Retry { .. } => unreachable!("retry_until_settled settles"),
                }
                if let Some(n) = uids.get_mut(&event.uid) {
                    *n -= 1;
                    if *n == 0 {
                        uids.remove(&event.uid);
                    }
                }
                self.status.set_acked(event.resource_version);
            }
        }
    }

    /// Sends an event again until the broker stores or refuses it. The id is unchanged, so a
    /// copy the broker did store is recognised as a duplicate.
    async fn retry_until_settled(&self, mut delivered: Delivered) -> Delivered {
        let mut backoff = Backoff::default();
        while let Outcome::Retry { error } = &delivered.outcome {
            self.status.retried.fetch_add(1, Ordering::Relaxed);
            let delay = backoff.next_delay().min(Duration::from_secs(5));
            warn!(object = %delivered.event.reference(), error = %error, retry_in_ms = delay.as_millis() as u64, "publish failed, retrying");
            tokio::time::sleep(delay).await;
            delivered = self.sink.send(delivered.event).await.await;
        }
        delivered
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::change::{Change, Origin};
    use crate::sink::stdout::StdoutSink;
    use kube::api::{DynamicObject, ObjectMeta};
    use std::time::SystemTime;

    fn change(kind: ChangeKind, uid: &str, rv: &str) -> Item {
        Item::Change(Change {
            kind,
            origin: Origin::Live,
            object: DynamicObject {
                types: None,
                metadata: ObjectMeta {
                    name: Some(format!("n-{uid}")),
                    namespace: Some("ns".into()),
                    uid: Some(uid.into()),
                    resource_version: Some(rv.into()),
                    ..Default::default()
                },
                data: serde_json::json!({}),
            },
            observed: SystemTime::now(),
        })
    }

    fn info() -> Arc<ResourceInfo> {
        let resolved = crate::discovery::ResolvedResource {
            config: crate::config::ConfigFile::parse(
                "cluster: dev\nresources: [{apiVersion: v1, resource: configmaps}]\n",
            )
            .unwrap()
            .validate()
            .unwrap()
            .resources
            .remove(0),
            api: kube::discovery::ApiResource {
                group: String::new(),
                version: "v1".into(),
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                plural: "configmaps".into(),
            },
            namespaced: true,
        };
        Arc::new(ResourceInfo::new("dev", &resolved))
    }

    #[tokio::test]
    async fn filters_publishes_and_advances_in_order() {
        let status = Arc::new(Status::default());
        let p = Pipeline {
            info: info(),
            events: [ChangeKind::Added, ChangeKind::Deleted].into(),
            sink: Arc::new(AnySink::Stdout(StdoutSink::new())),
            max_in_flight: 2,
            status: status.clone(),
        };
        let (tx, rx) = mpsc::channel(4);
        let task = tokio::spawn(p.run(rx));
        tx.send(change(ChangeKind::Added, "a", "1")).await.unwrap();
        tx.send(change(ChangeKind::Modified, "a", "2"))
            .await
            .unwrap();
        tx.send(Item::Synced).await.unwrap();
        tx.send(change(ChangeKind::Deleted, "a", "3"))
            .await
            .unwrap();
        tx.send(Item::Progress("7".into())).await.unwrap();
        drop(tx);
        task.await.unwrap();
        assert_eq!(status.published.load(Ordering::Relaxed), 2);
        assert_eq!(status.filtered.load(Ordering::Relaxed), 1);
        assert!(status.synced.load(Ordering::Relaxed));
        assert_eq!(status.acked_resource_version().as_deref(), Some("7"));
    }
}
