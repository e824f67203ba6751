//! Wires a validated [`Config`] into running watches and pipelines, and shuts them down: the first
//! signal stops the watches and drains what is in flight within the grace period.

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube::api::{Api, DynamicObject, TypeMeta};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, info_span, warn};

use crate::config::{Config, KubernetesConfig};
use crate::discovery::{self, ResolvedResource};
use crate::encode::ResourceInfo;
use crate::pipeline::{Pipeline, Status};
use crate::sink::{self, AnySink};
use crate::watch::{self, Target};

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
}

/// A `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Builds a client: the configured kubeconfig and context, else in-cluster, else `KUBECONFIG` or
/// `~/.kube/config`.
pub async fn client(k: &KubernetesConfig) -> Result<Client> {
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
    Client::try_from(config).map_err(Error::Client)
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

/// The running bridge.
#[derive(Debug)]
pub struct Bridge {
    watches: Vec<WatchHandle>,
    stop_watches: CancellationToken,
    tasks: JoinSet<()>,
    sink: Arc<AnySink>,
}

/// Watches and pipelines sized per resource.
const PAGE_SIZE: u32 = 500;
/// Below the API server's 5-minute limit, like client-go's reflector.
const WATCH_TIMEOUT_SECS: u32 = 290;

impl Bridge {
    /// Resolves every resource, connects the sink and starts one watch and one pipeline per
    /// resource and namespace scope.
    pub async fn start(config: Config) -> Result<Self> {
        let client = client(&config.kubernetes).await?;
        let resources = discovery::resolve(&client, &config.resources).await?;
        for r in &resources {
            if !r.config.redact_secret_data && r.api.group.is_empty() && r.api.plural == "secrets" {
                warn!(resource = %r.label(), "Secret redaction is OFF for this resource: secret values will be published in clear");
            }
        }
        let sink = Arc::new(AnySink::connect(&config.cluster, &config.sink, &resources).await?);
        info!(
            sink = sink.name(),
            resources = resources.len(),
            "sink connected"
        );
        let stop_watches = CancellationToken::new();
        let mut tasks = JoinSet::new();
        let mut watches = Vec::new();
        for r in &resources {
            let info = Arc::new(ResourceInfo::new(&config.cluster, r));
            for namespace in r.scopes() {
                let status = Arc::new(Status::default());
                let (tx, rx) = mpsc::channel(config.delivery.queue_capacity);
                let span = info_span!("watch", resource = %r.label(), namespace = namespace.as_deref().unwrap_or("*"));
                let target = target(&client, r, namespace.as_deref());
                tasks.spawn(
                    watch::run(target, watch::State::default(), tx, stop_watches.clone())
                        .instrument(span.clone()),
                );
                let pipeline = Pipeline {
                    info: info.clone(),
                    events: r.config.events.clone(),
                    sink: sink.clone(),
                    max_in_flight: config.delivery.max_in_flight,
                    status: status.clone(),
                };
                tasks.spawn(pipeline.run(rx).instrument(span));
                watches.push(WatchHandle {
                    resource: r.label(),
                    namespace,
                    status,
                });
            }
        }
        info!(watches = watches.len(), "bridge started");
        Ok(Self {
            watches,
            stop_watches,
            tasks,
            sink,
        })
    }

    /// The watches and their status.
    pub fn watches(&self) -> &[WatchHandle] {
        &self.watches
    }

    /// Whether every watch has published its initial state.
    pub fn synced(&self) -> bool {
        self.watches
            .iter()
            .all(|w| w.status.synced.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Stops the watches, then waits up to `grace` for the pipelines to drain and the sink to
    /// flush. Returns whether everything drained in time.
    pub async fn shutdown(mut self, grace: Duration) -> bool {
        info!(
            grace_secs = grace.as_secs(),
            "shutting down: stopping watches, draining in-flight events"
        );
        self.stop_watches.cancel();
        let deadline = tokio::time::Instant::now() + grace;
        let drained = tokio::time::timeout_at(deadline, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await
        .is_ok();
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        self.sink.flush(left.max(Duration::from_millis(100))).await;
        if !drained {
            warn!(
                "grace period over with events still in flight; they will be published again after restart"
            );
            self.tasks.abort_all();
        }
        drained
    }

    /// Waits until every task has ended on its own (it normally never does).
    pub async fn join(&mut self) {
        while self.tasks.join_next().await.is_some() {}
    }
}

fn target(client: &Client, r: &ResolvedResource, namespace: Option<&str>) -> Target {
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
        watch_timeout_secs: WATCH_TIMEOUT_SECS,
    }
}
