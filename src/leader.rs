//! Leader election over a `coordination.k8s.io/v1` Lease, so several replicas can run and one
//! publishes. The Lease alone is not fencing: a deposed leader that still runs is stopped by the
//! broker (Kafka transactional id, NATS KV revision), and, before that, by its own view of the
//! lease: it publishes nothing once its last successful renewal is older than the lease duration
//! (monotonic time keeps running while a process is stopped, so a SIGSTOP'd leader notices).

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::{Api, ObjectMeta};
use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};

use crate::backoff::Backoff;
use crate::config::{Config, LeaderElectionConfig};
use crate::kubernetes;
use crate::lease::{self, Seen, Validity};
use crate::tasks::Tasks;

/// Errors of leader election that waiting will not heal; transient ones (5xx, 429, timeouts,
/// connection errors) are retried with backoff and never surface.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The bridge's identity may not read or write the Lease: RBAC is missing.
    #[error(
        "lease {namespace}/{name}: forbidden: the bridge's ServiceAccount needs get, create and \
         update on leases.coordination.k8s.io in namespace {namespace} \
         (`kube-event-bridge rbac` prints the Role)"
    )]
    Forbidden {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// The Lease's namespace does not exist.
    #[error(
        "lease {namespace}/{name}: namespace {namespace} does not exist (leaderElection.namespace)"
    )]
    NamespaceNotFound {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// The Lease API failed in a way that retrying will not fix (bad credentials, invalid request).
    #[error("lease {namespace}/{name}")]
    Api {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// Leader election's own Kubernetes client could not be built.
    #[error(transparent)]
    Kubernetes(#[from] kubernetes::Error),
}

/// A `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Leader election settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Lease namespace.
    pub namespace: String,
    /// Lease name.
    pub name: String,
    /// This replica's identity.
    pub identity: String,
    /// How long a lease stays valid without renewal.
    pub lease_duration: Duration,
    /// How often the leader renews and followers retry.
    pub retry_period: Duration,
}

impl Settings {
    /// The settings `leaderElection` asks for; what it leaves out comes from the pod's
    /// environment, read through `env`: the namespace from `POD_NAMESPACE` (else `default`), the
    /// identity from `POD_NAME` (else `HOSTNAME`) and the process id.
    pub fn new(
        le: &LeaderElectionConfig,
        cluster: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Self {
        let host = env("POD_NAME")
            .or_else(|| env("HOSTNAME"))
            .unwrap_or_else(|| "kube-event-bridge".into());
        Self {
            namespace: le
                .namespace
                .clone()
                .or_else(|| env("POD_NAMESPACE"))
                .unwrap_or_else(|| "default".into()),
            name: le
                .lease_name
                .clone()
                .unwrap_or_else(|| format!("kube-event-bridge-{cluster}")),
            identity: le
                .identity
                .clone()
                .unwrap_or_else(|| format!("{host}-{}", std::process::id())),
            lease_duration: Duration::from_secs(le.lease_duration_secs),
            retry_period: Duration::from_secs(le.retry_period_secs),
        }
    }
}

/// Held leadership: the [`Validity`] every publisher checks, and the hand-off of the Lease at a
/// clean shutdown ([`Leader::release`]).
#[derive(Debug)]
pub struct Leader {
    validity: Validity,
    release: mpsc::Sender<oneshot::Sender<()>>,
}

impl Leader {
    /// The validity of this leadership (cheap to clone; lost when the Lease is).
    pub fn validity(&self) -> &Validity {
        &self.validity
    }

    /// Hands the Lease over: stops acting as the leader, then clears the Lease's holder so a
    /// follower takes it at its next attempt instead of waiting for it to expire. Call it only
    /// once nothing is published any more (the watches drained). Waits at most
    /// [`RELEASE_TIMEOUT`]; a Lease that cannot be released expires instead.
    pub async fn release(self) {
        self.validity.lose();
        let (done, released) = oneshot::channel();
        if self.release.send(done).await.is_ok() {
            let _ = tokio::time::timeout(RELEASE_TIMEOUT, released).await;
        }
    }
}

/// How long [`Leader::release`] waits for the Lease to be released.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// Waits for leadership when the configuration asks for leader election (with a client of its
/// own, see [`kubernetes::client`]); `None` when it does not.
/// The Lease is renewed by a task of `tasks`.
pub async fn elect(config: &Config, tasks: &Tasks) -> Result<Option<Leader>> {
    if !config.leader_election.enabled {
        return Ok(None);
    }
    let client = kubernetes::client(&config.kubernetes).await?;
    let settings = Settings::new(&config.leader_election, &config.cluster, |name| {
        std::env::var(name).ok()
    });
    Ok(Some(acquire(client, settings, tasks).await?))
}

/// Waits until this replica holds the lease, then keeps renewing it on a task of `tasks`.
/// Transient API errors while waiting are logged and retried with backoff; only an error that
/// will not heal (RBAC, a missing namespace, bad credentials) is returned.
pub async fn acquire(client: Client, s: Settings, tasks: &Tasks) -> Result<Leader> {
    let api: Api<Lease> = Api::namespaced(client, &s.namespace);
    let validity = Validity::unrenewed();
    // The holder's Lease is judged expired by how long it has not changed, as observed here.
    let mut seen: Option<Seen> = None;
    let mut backoff = Backoff::default();
    info!(lease = %s.name, namespace = %s.namespace, identity = %s.identity, "waiting for leadership");
    loop {
        let at = Instant::now();
        let delay = match try_acquire(&api, &s, &mut seen).await {
            Ok(Some(held)) => {
                validity.renewed(s.lease_duration, at);
                info!(lease = %s.name, identity = %s.identity, "leadership acquired");
                let (release, asked) = mpsc::channel(1);
                tasks.spawn("leader lease", hold(api, s, held, validity.clone(), asked));
                return Ok(Leader { validity, release });
            }
            Ok(None) => {
                backoff.reset();
                s.retry_period
            }
            Err(source) if lease::is_transient(&source) => {
                let delay = backoff.next_delay().max(s.retry_period);
                warn!(
                    lease = %s.name,
                    namespace = %s.namespace,
                    error = %source,
                    retry_in_ms = delay.as_millis() as u64,
                    "lease request failed while waiting for leadership, retrying"
                );
                delay
            }
            Err(source) => return Err(fatal(&s, source)),
        };
        tokio::time::sleep(delay).await;
    }
}

/// One attempt to take the Lease: the Lease as written when taken, `None` when someone else
/// holds it (or won a race for it).
async fn try_acquire(
    api: &Api<Lease>,
    s: &Settings,
    seen: &mut Option<Seen>,
) -> Result<Option<Lease>, kube::Error> {
    let Some(current) = api.get_opt(&s.name).await? else {
        let metadata = ObjectMeta {
            name: Some(s.name.clone()),
            namespace: Some(s.namespace.clone()),
            ..Default::default()
        };
        return lease::write(api, &lease::new(metadata, &s.identity, s.lease_duration)).await;
    };
    let seen = Seen::record(seen, current, Instant::now());
    if seen.holder().is_some_and(|h| h != s.identity) {
        return Ok(None);
    }
    lease::write(
        api,
        &lease::held_by(&seen.lease, &s.identity, s.lease_duration),
    )
    .await
}

/// The error for a Lease request that retrying will not fix.
fn fatal(s: &Settings, source: kube::Error) -> Error {
    let (namespace, name) = (s.namespace.clone(), s.name.clone());
    match &source {
        kube::Error::Api(status) if status.code == 403 => Error::Forbidden {
            namespace,
            name,
            source,
        },
        // Only a create answers 404 here: the namespace is missing.
        kube::Error::Api(status) if status.code == 404 => Error::NamespaceNotFound {
            namespace,
            name,
            source,
        },
        _ => Error::Api {
            namespace,
            name,
            source,
        },
    }
}

/// What one renewal found.
enum Renewal {
    /// Renewed: the Lease as written.
    Renewed(Box<Lease>),
    /// Not renewed this time (a failed request, a lost race): try again.
    Retry,
    /// Leadership is lost, for this reason.
    Lost(&'static str),
}

/// Renews every retry period until leadership is lost (the Lease held by someone else or
/// deleted, or renewals failing for longer than the Lease is valid) or released.
async fn hold(
    api: Api<Lease>,
    s: Settings,
    mut held: Lease,
    validity: Validity,
    mut release: mpsc::Receiver<oneshot::Sender<()>>,
) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(s.retry_period) => {}
            Some(done) = release.recv() => {
                validity.lose();
                hand_off(&api, &s, held).await;
                let _ = done.send(());
                return;
            }
        }
        if !validity.is_valid() {
            warn!(lease = %s.name, "lease not renewed in time: leadership lost");
            break;
        }
        let at = Instant::now();
        match renew(&api, &s).await {
            Renewal::Renewed(lease) => {
                validity.renewed(s.lease_duration, at);
                held = *lease;
            }
            Renewal::Retry => {}
            Renewal::Lost(reason) => {
                warn!(lease = %s.name, reason, "leadership lost");
                break;
            }
        }
    }
    validity.lose();
}

/// One renewal: read the Lease, and write it back still held by this replica.
async fn renew(api: &Api<Lease>, s: &Settings) -> Renewal {
    let current = match api.get_opt(&s.name).await {
        Ok(Some(l)) => l,
        Ok(None) => return Renewal::Lost("lease deleted"),
        Err(e) => {
            warn!(lease = %s.name, error = %e, "lease renewal failed, retrying");
            return Renewal::Retry;
        }
    };
    if lease::holder(&current) != Some(s.identity.as_str()) {
        warn!(lease = %s.name, holder = lease::holder(&current).unwrap_or(""), "lease taken over");
        return Renewal::Lost("lease taken over");
    }
    match lease::write(
        api,
        &lease::held_by(&current, &s.identity, s.lease_duration),
    )
    .await
    {
        Ok(Some(written)) => Renewal::Renewed(Box::new(written)),
        Ok(None) => Renewal::Retry,
        Err(e) => {
            warn!(lease = %s.name, error = %e, "lease renewal failed, retrying");
            Renewal::Retry
        }
    }
}

/// Clears the holder of the Lease last written as `held` (a compare-and-swap: a Lease changed
/// since is someone else's business); the Lease expires instead if that fails.
async fn hand_off(api: &Api<Lease>, s: &Settings, held: Lease) {
    match lease::write(api, &lease::released(&held)).await {
        Ok(Some(_)) => info!(lease = %s.name, "leadership released"),
        Ok(None) => info!(lease = %s.name, "lease changed since renewed: not released"),
        Err(e) => {
            warn!(lease = %s.name, error = %e, "cannot release the lease; it expires instead")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(
            serde_json::from_value(serde_json::json!({"code": code, "message": "m"})).unwrap(),
        ))
    }

    #[test]
    fn settings_come_from_the_config_then_the_pod_environment() {
        let env = |name: &str| match name {
            "POD_NAME" => Some("keb-7d9f".to_string()),
            "HOSTNAME" => Some("node-host".to_string()),
            "POD_NAMESPACE" => Some("bridges".to_string()),
            _ => None,
        };
        let defaults = LeaderElectionConfig {
            enabled: true,
            ..Default::default()
        };
        let s = Settings::new(&defaults, "dev", env);
        assert_eq!(s.namespace, "bridges");
        assert_eq!(s.name, "kube-event-bridge-dev");
        assert_eq!(s.identity, format!("keb-7d9f-{}", std::process::id()));
        assert_eq!(
            s.lease_duration,
            Duration::from_secs(defaults.lease_duration_secs)
        );
        assert_eq!(
            s.retry_period,
            Duration::from_secs(defaults.retry_period_secs)
        );

        let outside_a_pod = Settings::new(&defaults, "dev", |name| {
            (name == "HOSTNAME").then(|| "laptop".to_string())
        });
        assert_eq!(outside_a_pod.namespace, "default");
        assert_eq!(
            outside_a_pod.identity,
            format!("laptop-{}", std::process::id())
        );

        let configured = LeaderElectionConfig {
            enabled: true,
            lease_name: Some("my-lease".into()),
            namespace: Some("ops".into()),
            identity: Some("replica-1".into()),
            lease_duration_secs: 30,
            retry_period_secs: 4,
        };
        let s = Settings::new(&configured, "dev", env);
        assert_eq!(
            (s.namespace.as_str(), s.name.as_str(), s.identity.as_str()),
            ("ops", "my-lease", "replica-1")
        );
        assert_eq!(s.lease_duration, Duration::from_secs(30));
        assert_eq!(s.retry_period, Duration::from_secs(4));
    }

    #[test]
    fn a_refusal_names_the_lease_and_what_is_missing() {
        let s = Settings {
            namespace: "ops".into(),
            name: "keb".into(),
            identity: "me".into(),
            lease_duration: Duration::from_secs(15),
            retry_period: Duration::from_secs(2),
        };
        let forbidden = fatal(&s, api(403)).to_string();
        assert!(
            forbidden.starts_with("lease ops/keb: forbidden"),
            "{forbidden}"
        );
        assert!(
            forbidden
                .contains("get, create and update on leases.coordination.k8s.io in namespace ops"),
            "{forbidden}"
        );
        let missing = fatal(&s, api(404)).to_string();
        assert!(
            missing.contains("namespace ops does not exist"),
            "{missing}"
        );
        assert!(matches!(fatal(&s, api(401)), Error::Api { .. }));
    }
}
