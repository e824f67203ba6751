//! The checkpoint stores of all watches: where checkpoints live follows the sink (a compacted
//! Kafka topic written in each watch's transaction, a NATS KV bucket, or files beside standard
//! output), tied to the identity of the cluster. [`Stores::prepare`] readies the store once at
//! start; [`Stores::for_watch`] gives each watch its sink and its checkpoint store.

use std::sync::Arc;

use kube::Client;

use crate::checkpoint::{
    self, Backend, Cluster, FileStore, KafkaStore, NatsStore, Store, WatchKey,
};
use crate::config::{self as cfg, Config};
use crate::sink::kafka::KafkaSink;
use crate::sink::{self, AnySink};

/// Errors of preparing the checkpoint stores or a watch's store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The checkpoint store could not be prepared (topic, bucket, directory, cluster identity).
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::Error),
    /// A watch's transactional Kafka producer could not be created.
    #[error(transparent)]
    Sink(#[from] sink::Error),
}

/// A `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the checkpoint stores of all watches share.
pub(crate) struct Stores {
    kind: StoresKind,
    /// The cluster checkpoints are tied to (`None` when nothing is durable).
    cluster: Option<Cluster>,
}

#[expect(clippy::large_enum_variant, reason = "one value per process")]
enum StoresKind {
    /// Per-watch transactional producers writing to this topic.
    Kafka { topic: String },
    /// One KV bucket.
    Nats(async_nats::jetstream::kv::Store),
    /// Files in a directory.
    Files(std::path::PathBuf),
    /// Nothing durable.
    Memory,
}

impl Stores {
    /// Prepares the checkpoint store (creating or checking the Kafka topic, opening the KV bucket
    /// or the directory) and reads the identity of the cluster checkpoints are tied to.
    pub(crate) async fn prepare(
        config: &Config,
        shared: &Arc<AnySink>,
        client: &Client,
    ) -> Result<Self> {
        let c = &config.checkpoint;
        if !config.keeps_checkpoints() {
            return Ok(Stores {
                kind: StoresKind::Memory,
                cluster: None,
            });
        }
        let cluster = Cluster::identify(&config.cluster, client).await?;
        let store_err = |store: &'static str, e: &dyn std::fmt::Display| checkpoint::Error::Store {
            store,
            message: e.to_string(),
        };
        let kind = match shared.as_ref() {
            AnySink::Kafka(k) => {
                checkpoint::kafka::ensure_topic(k.consumer_config(), &c.kafka_topic).await?;
                StoresKind::Kafka {
                    topic: c.kafka_topic.clone(),
                }
            }
            AnySink::Nats(n) => {
                let js = n
                    .jetstream()
                    .ok_or_else(|| store_err("nats", &"core NATS cannot checkpoint"))?;
                StoresKind::Nats(checkpoint::nats_bucket(js, &c.nats_bucket).await?)
            }
            AnySink::Stdout(_) => {
                let dir = c.directory.clone().unwrap_or_default();
                tokio::fs::create_dir_all(&dir)
                    .await
                    .map_err(|e| store_err("file", &format!("{}: {e}", dir.display())))?;
                StoresKind::Files(dir)
            }
        };
        Ok(Stores {
            kind,
            cluster: Some(cluster),
        })
    }

    /// The sink and checkpoint store of one watch. A Kafka watch gets its own transactional
    /// producer (its transactional id fences an older instance of the same watch).
    pub(crate) async fn for_watch(
        &self,
        config: &Config,
        shared: &Arc<AnySink>,
        key: &WatchKey,
    ) -> Result<(Arc<AnySink>, Store)> {
        let cluster = self.cluster.clone();
        let (sink, backend) = match &self.kind {
            StoresKind::Kafka { topic } => {
                let cfg::Sink::Kafka {
                    config: kafka,
                    topic: template,
                } = &config.sink
                else {
                    unreachable!("kafka stores need a kafka sink")
                };
                let id = format!("kube-event-bridge.{}", key.id);
                let producer =
                    Arc::new(KafkaSink::new_transactional(kafka, template.clone(), &id).await?);
                let backend = Backend::Kafka(KafkaStore {
                    key: key.clone(),
                    sink: producer.clone(),
                    topic: topic.clone(),
                    cluster,
                });
                (Arc::new(AnySink::Kafka(producer)), backend)
            }
            StoresKind::Nats(kv) => (
                shared.clone(),
                Backend::Nats(NatsStore::new(key.clone(), kv.clone(), cluster)),
            ),
            StoresKind::Files(dir) => (
                shared.clone(),
                Backend::File(FileStore {
                    key: key.clone(),
                    path: dir.join(format!("{}.checkpoint", key.id)),
                    cluster,
                }),
            ),
            StoresKind::Memory => (shared.clone(), Backend::Memory),
        };
        Ok((sink, Store::new(backend)))
    }
}
