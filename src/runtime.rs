//! Wires a validated [`Config`] into running watches and pipelines, and shuts them down: the first
//! signal stops the watches and drains what is in flight within the grace period.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube::api::{Api, DynamicObject, TypeMeta};
use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::checkpoint::{
    self, Backend, Cluster, FileStore, KafkaStore, NatsStore, Store, WatchKey,
};
use crate::config::{Config, KubernetesConfig};
use crate::discovery::{self, ResolvedResource};
use crate::leader::{self, Leadership};
use crate::pipeline::Status;
use crate::sink::{self, AnySink, Checkpoints};
use crate::supervisor::{OnChange, Parts, Supervisor, list_namespaces};
use crate::throttle::{self, ThrottleLayer};
use crate::watch::Target;

/// Errors of starting the bridge.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kubeconfig could not be read.
    #[error("kubernetes.kubeconfig: cannot read {path}")]
    Kubeconfig {
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// No usable client configuration (in-cluster or kubeconfig).
    #[error("kubernetes: no usable client configuration")]
    ClientConfig(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The client could not be built.
    #[error("kubernetes: cannot build the client")]
    Client(#[source] kube::Error),
    /// A resource could not be resolved.
    #[error(transparent)]
    Discovery(#[from] discovery::Error),
    /// The sink could not be connected.
    #[error(transparent)]
    Sink(#[from] sink::Error),
    /// Leader election failed.
    #[error(transparent)]
    Leader(#[from] leader::Error),
    /// A checkpoint could not be loaded, or the checkpoint store prepared.
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::Error),
    /// The namespaces of a `namespaceSelector` could not be listed.
    #[error("namespaceSelector {selector:?}: {message}")]
    NamespaceSelector {
        /// The selector.
        selector: String,
        /// What failed.
        message: String,
    },
}

/// A `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Builds a client: the configured kubeconfig and context, else in-cluster, else `KUBECONFIG` or
/// `~/.kube/config`, throttled to `kubernetes.qps` and `kubernetes.burst` ([`crate::throttle`]).
///
/// Each call makes a client with its own token bucket: the watches share one, and leader election
/// has its own, so that a burst of relists cannot delay lease renewals (client-go's controllers
/// give leader election its own client for the same reason).
///
/// A token file (a kubeconfig's `tokenFile`, or the in-cluster service account token) is read
/// again by kube-client once the copy it holds is 50 seconds old, so rotated tokens are picked up.
pub async fn client(k: &KubernetesConfig) -> Result<Client> {
    Ok(client_and_url(k).await?.0)
}

/// A client and the API server's URL.
async fn client_and_url(k: &KubernetesConfig) -> Result<(Client, String)> {
    let options = KubeConfigOptions {
        context: k.context.clone(),
        ..Default::default()
    };
    let config = match &k.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path).map_err(|source| Error::Kubeconfig {
                path: path.display().to_string(),
                source,
            })?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|source| Error::Kubeconfig {
                    path: path.display().to_string(),
                    source,
                })?
        }
        None if k.context.is_some() => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|e| Error::ClientConfig(Box::new(e)))?,
        None => kube::Config::infer()
            .await
            .map_err(|e| Error::ClientConfig(Box::new(e)))?,
    };
    let url = config.cluster_url.to_string();
    let throttle = ThrottleLayer::new(k.qps, k.burst, throttle::Counters::process());
    let client = ClientBuilder::try_from(config)
        .map_err(Error::Client)?
        .with_layer(&throttle)
        .build();
    Ok((client, url))
}

/// Deletes the checkpoints of the watches of `resource` (`v1/configmaps`, `apps/v1/deployments`),
/// optionally only the one of `namespace`, so that the next start publishes a fresh snapshot.
/// Returns the watches reset.
pub async fn reset_checkpoints(
    config: &Config,
    resource: &str,
    namespace: Option<&str>,
) -> Result<Vec<String>> {
    let client = client(&config.kubernetes).await?;
    let resources = discovery::resolve(&client, &config.resources).await?;
    let shared = sink::connect(&config.sink).await?;
    let stores = Stores::prepare(config, &shared, &client).await?;
    let mut selected = HashMap::new();
    for r in resources.iter().filter(|r| r.label() == resource) {
        if let Some(selector) = &r.config.namespace_selector
            && !selected.contains_key(selector)
        {
            let found =
                list_namespaces(&client, selector)
                    .await
                    .map_err(|e| Error::NamespaceSelector {
                        selector: selector.clone(),
                        message: format!("cannot list namespaces: {e}"),
                    })?;
            selected.insert(selector.clone(), found);
        }
    }
    let mut reset = Vec::new();
    for r in resources.iter().filter(|r| r.label() == resource) {
        for scope in r
            .scopes(&selected)
            .into_iter()
            .filter(|s| namespace.is_none() || s.as_deref() == namespace)
        {
            let key = WatchKey::for_scope(&config.cluster, r, scope.as_deref());
            let (_, mut store) = stores.for_watch(&shared, &key).await?;
            store.reset().await?;
            reset.push(key.description);
        }
    }
    Ok(reset)
}

/// Waits for leadership when the configuration asks for leader election.
pub async fn elect(config: &Config) -> Result<Option<Leadership>> {
    let le = &config.leader_election;
    if !le.enabled {
        return Ok(None);
    }
    let client = client(&config.kubernetes).await?;
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "kube-event-bridge".into());
    let settings = leader::Settings {
        namespace: le
            .namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .unwrap_or_else(|| "default".into()),
        name: le
            .lease_name
            .clone()
            .unwrap_or_else(|| format!("kube-event-bridge-{}", config.cluster)),
        identity: le
            .identity
            .clone()
            .unwrap_or_else(|| format!("{host}-{}", std::process::id())),
        lease_duration: Duration::from_secs(le.lease_duration_secs),
        retry_period: Duration::from_secs(le.retry_period_secs),
    };
    Ok(Some(leader::acquire(client, settings).await?))
}

/// One watch: its label for logs and its pipeline's status.
#[derive(Debug, Clone)]
pub struct WatchHandle {
    /// `apps/v1/deployments`.
    pub resource: String,
    /// The namespace, `None` for all or cluster scope.
    pub namespace: Option<String>,
    /// Counters and acknowledged position.
    pub status: Arc<Status>,
}

/// The running bridge: a [`Supervisor`] task owning every watch and pipeline.
#[derive(Debug)]
pub struct Bridge {
    stop: CancellationToken,
    supervisor: JoinHandle<Result<(), String>>,
    sink: Arc<AnySink>,
}

/// Watches and pipelines sized per resource.
const PAGE_SIZE: u32 = 500;
/// Below the API server's 5-minute limit, like client-go's reflector.
const WATCH_TIMEOUT_SECS: u32 = 290;

impl Bridge {
    /// Resolves every resource, connects the sink, loads each watch's checkpoint and starts one
    /// watch and one pipeline per resource and namespace scope; from then on the supervisor
    /// follows CRDs and namespaces. `on_change` is told the running watches whenever they change.
    pub async fn start(
        config: Config,
        leadership: Option<Leadership>,
        on_change: OnChange,
    ) -> Result<Self> {
        let (client, api_server) = client_and_url(&config.kubernetes).await?;
        let resources = discovery::resolve(&client, &config.resources).await?;
        let shared = sink::connect(&config.sink).await?;
        info!(
            sink = shared.name(),
            resources = resources.len(),
            "sink connected"
        );
        let stores = Stores::prepare(&config, &shared, &client).await?;
        let stop = CancellationToken::new();
        let mut supervisor = Supervisor::new(Parts {
            config: Arc::new(config),
            client,
            api_server,
            sink: shared.clone(),
            stores,
            leadership,
            stop: stop.clone(),
            on_change,
        });
        supervisor.start(resources).await?;
        info!(watches = supervisor.handles().len(), "bridge started");
        Ok(Self {
            stop,
            supervisor: tokio::spawn(supervisor.run()),
            sink: shared,
        })
    }

    /// Stops the watches, then waits up to `grace` for the pipelines to drain and the sink to
    /// flush. Returns whether everything drained in time.
    pub async fn shutdown(mut self, grace: Duration) -> bool {
        info!(
            grace_secs = grace.as_secs(),
            "shutting down: stopping watches, draining in-flight events"
        );
        self.stop.cancel();
        let deadline = tokio::time::Instant::now() + grace;
        let drained = tokio::time::timeout_at(deadline, &mut self.supervisor)
            .await
            .is_ok();
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        self.sink.flush(left.max(Duration::from_millis(100))).await;
        if !drained {
            warn!(
                "grace period over with events still in flight; they will be published again after restart"
            );
            self.supervisor.abort();
        }
        drained
    }

    /// Waits until a watch or pipeline fails for good (fenced, checkpoint store lost) and returns
    /// why; while everything is healthy it never returns.
    pub async fn failure(&mut self) -> String {
        match (&mut self.supervisor).await {
            Ok(Err(failure)) => failure,
            Ok(Ok(())) => "every watch stopped".into(),
            Err(e) => format!("the supervisor task failed: {e}"),
        }
    }
}

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
    async fn prepare(config: &Config, shared: &Arc<AnySink>, client: &Client) -> Result<Self> {
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
        let kind = match shared.checkpoints() {
            Checkpoints::KafkaTopic(k) => {
                checkpoint::kafka::ensure_topic(k.consumer_config(), &c.kafka_topic).await?;
                StoresKind::Kafka {
                    topic: c.kafka_topic.clone(),
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
        shared: &Arc<AnySink>,
        key: &WatchKey,
    ) -> Result<(Arc<AnySink>, Store)> {
        let cluster = self.cluster.clone();
        let (sink, backend) = match &self.kind {
            StoresKind::Kafka { topic } => {
                let Checkpoints::KafkaTopic(kafka) = shared.checkpoints() else {
                    unreachable!("kafka stores need a kafka sink")
                };
                let producer = Arc::new(kafka.for_watch(&key.id).await?);
                let backend = Backend::Kafka(KafkaStore {
                    key: key.clone(),
                    sink: producer.clone(),
                    topic: topic.clone(),
                    cluster,
                });
                (producer as Arc<AnySink>, backend)
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

pub(crate) fn target(
    client: &Client,
    r: &ResolvedResource,
    namespace: Option<&str>,
    not_found: Arc<tokio::sync::Notify>,
    page_bytes: usize,
) -> Target {
    let api: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &r.api),
        None => Api::all_with(client.clone(), &r.api),
    };
    Target {
        api,
        types: TypeMeta {
            api_version: r.api.api_version.clone(),
            kind: r.api.kind.clone(),
        },
        label_selector: r.config.label_selector.clone(),
        field_selector: r.config.field_selector.clone(),
        page_size: PAGE_SIZE,
        page_bytes,
        watch_timeout_secs: WATCH_TIMEOUT_SECS,
        not_found,
    }
}
