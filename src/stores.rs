//! The checkpoint stores of all watches: where checkpoints live follows the sink (a compacted
//! Kafka topic written in each watch's transaction, a NATS KV bucket, or files beside standard
//! output), tied to the identity of the cluster. [`Stores::prepare`] readies the store once at
//! start; [`Stores::for_watch`] gives each watch its sink and its checkpoint store.

use std::sync::Arc;

use kube::Client;

use crate::checkpoint::{
    self, Cluster, FileStore, KafkaStore, MemoryStore, NatsStore, Store, WatchKey,
};
use crate::config::Config;
use crate::lease::Validity;
use crate::sink::kafka::{Sharing, WatchSinks};
use crate::sink::{self, AnySink, Checkpoints};

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
pub struct Stores {
    kind: StoresKind,
    /// The cluster checkpoints are tied to (`None` when nothing is durable).
    cluster: Option<Cluster>,
    /// The uid of namespace `kube-system`, read once at start when checkpoints are kept or the
    /// audit extensions are on (see [`Config::reads_cluster_identity`]).
    cluster_uid: Option<std::sync::Arc<str>>,
}

#[expect(clippy::large_enum_variant, reason = "one value per process")]
enum StoresKind {
    /// Transactional producers writing to this topic: one shared by the watches, with this
    /// transactional id, or one per watch (sharding).
    Kafka {
        topic: String,
        sharing: Sharing,
        sinks: WatchSinks,
    },
    /// One KV bucket.
    Nats(async_nats::jetstream::kv::Store),
    /// Files in a directory.
    Files(std::path::PathBuf),
    /// Nothing durable.
    Memory,
}

impl Stores {
    /// Prepares the checkpoint store (creating or checking the Kafka topic, opening the KV bucket
    /// or the directory) and reads the identity of the cluster checkpoints are tied to, which
    /// the `clusterid` extension also names.
    pub async fn prepare(config: &Config, shared: &Arc<AnySink>, client: &Client) -> Result<Self> {
        let c = &config.checkpoint;
        let cluster = if config.reads_cluster_identity() {
            Some(Cluster::identify(&config.cluster, client).await?)
        } else {
            None
        };
        let cluster_uid = cluster.as_ref().map(|c| Arc::from(c.uid.as_str()));
        let Some(cluster) = cluster.filter(|_| config.keeps_checkpoints()) else {
            return Ok(Stores {
                kind: StoresKind::Memory,
                cluster: None,
                cluster_uid,
            });
        };
        let kind = if let Some(n) = &c.nats {
            // A bucket every replica reaches, apart from a sink without a store of its own.
            let client = crate::sink::nats::connect_client(&n.url, &n.credentials).await?;
            let js = async_nats::jetstream::new(client);
            StoresKind::Nats(checkpoint::nats_bucket(&js, &c.nats_bucket).await?)
        } else {
            Self::sink_store(config, shared).await?
        };
        Ok(Stores {
            kind,
            cluster: Some(cluster),
            cluster_uid,
        })
    }

    /// The checkpoint store the sink offers: its Kafka topic, its JetStream bucket, or files.
    async fn sink_store(config: &Config, shared: &Arc<AnySink>) -> Result<StoresKind> {
        let c = &config.checkpoint;
        let store_err = |store: &'static str, e: &dyn std::fmt::Display| checkpoint::Error::Store {
            store,
            message: e.to_string(),
        };
        Ok(match shared.checkpoints() {
            Checkpoints::KafkaTopic(k) => {
                checkpoint::kafka::ensure_topic(k.consumer_config(), &c.kafka_topic).await?;
                StoresKind::Kafka {
                    sinks: *k,
                    topic: c.kafka_topic.clone(),
                    sharing: if config.sharding.enabled {
                        Sharing::Watch
                    } else {
                        Sharing::Sink(transactional_id(config))
                    },
                }
            }
            Checkpoints::NatsBucket(js) => {
                StoresKind::Nats(checkpoint::nats_bucket(js, &c.nats_bucket).await?)
            }
            Checkpoints::Unsupported(why) => return Err(store_err(shared.name(), &why).into()),
            Checkpoints::Directory => {
                let dir = c.directory.clone().unwrap_or_default();
                tokio::fs::create_dir_all(&dir)
                    .await
                    .map_err(|e| store_err("file", &format!("{}: {e}", dir.display())))?;
                StoresKind::Files(dir)
            }
        })
    }

    /// Whether a watch's checkpoint loads through a read shared with the other watches loading
    /// at the time (the Kafka topic's, `src/sink/kafka/reads.rs`): the more wait together, the
    /// fewer reads of the whole topic.
    pub fn loads_share_reads(&self) -> bool {
        matches!(self.kind, StoresKind::Kafka { .. })
    }

    /// The uid of namespace `kube-system`, when it was read at start.
    pub fn cluster_uid(&self) -> Option<Arc<str>> {
        self.cluster_uid.clone()
    }

    /// The sink and checkpoint store of one watch. A Kafka watch gets its share of the sink's
    /// transactional producer, or with sharding one of its own (a transactional id fences an
    /// older instance with the same id); `owner` is valid while this process owns the watch
    /// (its leader or watch Lease; `None` without either).
    pub async fn for_watch(
        &self,
        shared: &Arc<AnySink>,
        key: &WatchKey,
        owner: Option<Validity>,
    ) -> Result<(Arc<AnySink>, Store)> {
        let cluster = self.cluster.clone();
        let (sink, store) = match &self.kind {
            StoresKind::Kafka {
                topic,
                sharing,
                sinks,
            } => {
                let producer = Arc::new(sinks.for_watch(&key.id, sharing, owner).await?);
                let store = Store::new(KafkaStore {
                    key: key.clone(),
                    sink: producer.clone(),
                    topic: topic.clone(),
                    cluster,
                });
                (producer as Arc<AnySink>, store)
            }
            StoresKind::Nats(kv) => (
                shared.clone(),
                Store::new(NatsStore::new(key.clone(), kv.clone(), cluster)),
            ),
            StoresKind::Files(dir) => (
                shared.clone(),
                Store::new(FileStore {
                    key: key.clone(),
                    path: dir.join(format!("{}.checkpoint", key.id)),
                    cluster,
                }),
            ),
            StoresKind::Memory => (shared.clone(), Store::new(MemoryStore)),
        };
        Ok((sink, store))
    }
}

/// The transactional id the watches of this configuration share without sharding:
/// `kube-event-bridge.{cluster}.{16 hex digits}`, the digits a hash of the checkpoint topic and
/// of what the resources select. Replicas electing a leader share it (the new leader fences the
/// old one); bridges watching other resources of the same cluster get another.
fn transactional_id(config: &Config) -> String {
    let mut selected = format!("{}\n", config.checkpoint.kafka_topic);
    for r in &config.resources {
        let excluded: Vec<String> = r
            .exclude
            .iter()
            .map(|e| format!("{:?}/{:?}/{}", e.group, e.version, e.resource))
            .collect();
        selected.push_str(&format!(
            "{}|{}|{:?}|{:?}|{:?}|{:?}|{:?}\n",
            r.api_version(),
            r.resource,
            r.namespaces,
            r.namespace_selector,
            r.label_selector,
            r.field_selector,
            excluded,
        ));
    }
    let hash = crate::known::stable_hash(selected.as_bytes());
    format!(
        "kube-event-bridge.{}.{hash:016x}",
        checkpoint::key_safe(&config.cluster)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigFile;

    #[test]
    fn transactional_ids_of_odd_cluster_names_are_pinned() {
        // Kafka keeps transaction state by this id, and a new producer fences an older one only
        // under the same id: whatever a cluster name holds, the id stays what it always was.
        let mut config = ConfigFile::parse(
            "cluster: prod.eu-1\nresources: [{apiVersion: v1, resource: pods}]\nsink: {kafka: {bootstrapServers: 'k:9092'}}\n",
        )
        .unwrap()
        .validate()
        .unwrap();
        for (cluster, id) in [
            ("prod.eu-1", "kube-event-bridge.prod_eu-1.525c9ef63bbd2fc7"),
            ("a/b c", "kube-event-bridge.a_b_c.525c9ef63bbd2fc7"),
            ("Zürich_2", "kube-event-bridge.Z_rich_2.525c9ef63bbd2fc7"),
            ("日本", "kube-event-bridge.__.525c9ef63bbd2fc7"),
            ("", "kube-event-bridge..525c9ef63bbd2fc7"),
        ] {
            config.cluster = cluster.into();
            assert_eq!(transactional_id(&config), id, "{cluster:?}");
        }
    }
}
