//! One cluster of a fleet: its client, identity, checkpoint stores, discovery and
//! [`Supervisor`], started and run until the fleet stops it. When the cluster cannot be reached,
//! is refused (the same cluster as another member) or its watches fail for good, only this
//! cluster stops publishing: the [`Observer`] is told why (readiness, metrics) and the start is
//! tried again with backoff.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{Instrument, error, info, info_span, warn};

use super::{Error, Reach, Shared};
use crate::backoff::Backoff;
use crate::discovery;
use crate::kubernetes;
use crate::stores::Stores;
use crate::supervisor::{Parts, Supervisor, error_chain};

/// How long connecting to a cluster (client, identity, checkpoint store, discovery) may take
/// before it counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the start of its watches may take (the checkpoint loads, each bounded, and the
/// first namespace listings).
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs the cluster `name` until `stop` is cancelled (then drains its watches), starting it
/// again with backoff whenever it cannot start or fails.
pub(super) async fn run(shared: Arc<Shared>, name: String, reach: Reach, stop: CancellationToken) {
    let span = info_span!("cluster", cluster = %name);
    let mut backoff = Backoff::default();
    loop {
        let failure = once(&shared, &name, &reach, &stop)
            .instrument(span.clone())
            .await;
        let Some(failure) = failure else {
            return;
        };
        let chain = error_chain(&failure);
        shared.observer.watches(&name, Vec::new());
        shared.observer.problem(&name, Some(chain.clone()));
        let delay = backoff.next_delay();
        span.in_scope(|| {
            error!(error = %chain, retry_in_ms = delay.as_millis() as u64, "cluster not publishing; trying again");
        });
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
        }
    }
}

/// Connects to the cluster and runs its watches until `stop` (returns `None`) or a failure.
async fn once(
    shared: &Arc<Shared>,
    name: &str,
    reach: &Reach,
    stop: &CancellationToken,
) -> Option<Error> {
    let connected = tokio::select! {
        () = stop.cancelled() => return None,
        c = tokio::time::timeout(CONNECT_TIMEOUT, connect(shared, name, reach)) => c,
    };
    let (parts, resources, _uid) = match connected {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return Some(e),
        Err(_) => {
            return Some(Error::Unreachable {
                secs: CONNECT_TIMEOUT.as_secs(),
            });
        }
    };
    let mut supervisor = Supervisor::new(Parts {
        stop: stop.child_token(),
        ..parts
    });
    // A start already writing to the broker and the checkpoint store finishes even when the
    // fleet stops meanwhile; the run then drains at once.
    match tokio::time::timeout(START_TIMEOUT, supervisor.start(resources)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Some(e.into()),
        Err(_) => {
            return Some(Error::StartTimeout {
                secs: START_TIMEOUT.as_secs(),
            });
        }
    }
    shared.observer.problem(name, None);
    info!(watches = supervisor.handles().len(), "cluster publishing");
    supervisor.run().await.err().map(Error::from)
}

/// Reaches the cluster: its client, checkpoint stores (which read its identity), its claim on
/// that identity, and its resources.
async fn connect(
    shared: &Arc<Shared>,
    name: &str,
    reach: &Reach,
) -> Result<(Parts, Vec<discovery::ResolvedResource>, super::Claim), Error> {
    let (kubernetes, client, api_server) = match reach {
        Reach::Configured(access) => {
            let k = access.kubernetes().clone();
            let (client, url) = kubernetes::client_and_url(&k).await?;
            (k, client, url)
        }
        Reach::Secret(d) => {
            let k = shared.config.kubernetes.clone();
            let (client, url) =
                kubernetes::client_from_kubeconfig(&d.secret, d.kubeconfig.clone(), k.qps, k.burst)
                    .await?;
            (k, client, url)
        }
    };
    let config = Arc::new(shared.config.for_cluster(name, kubernetes));
    let stores = Stores::prepare(&config, &shared.sink, &client).await?;
    let uid = stores.cluster_uid().unwrap_or_default();
    let claim = shared.claim(name, &uid)?;
    let found = discovery::discover(&client).await?;
    let (resources, missing) = discovery::select(&config.resources, &found);
    for m in missing {
        warn!(problem = %m, "resource not served by this cluster; its other resources are watched");
    }
    let observer = shared.observer.clone();
    let cluster = name.to_string();
    let parts = Parts {
        config,
        client,
        api_server,
        sink: shared.sink.clone(),
        stores,
        leadership: shared.leadership.clone(),
        shard: shared.shard.clone(),
        stop: CancellationToken::new(),
        on_change: Box::new(move |w| observer.watches(&cluster, w)),
        tasks: shared.tasks.clone(),
        total: shared.total.clone(),
    };
    Ok((parts, resources, claim))
}
