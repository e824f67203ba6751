//! Leader election over a `coordination.k8s.io/v1` Lease, so several replicas can run and one
//! publishes. The Lease alone is not fencing: a deposed leader that still runs is stopped by the
//! broker (Kafka transactional id, NATS KV revision), and, before that, by its own view of the
//! lease: it publishes nothing once its last successful renewal is older than the lease duration
//! (monotonic time keeps running while a process is stopped, so a SIGSTOP'd leader notices).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::backoff::Backoff;
use crate::config::{Config, LeaderElectionConfig};
use crate::kubernetes;

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

/// Whether a failed Lease request may succeed when repeated: server errors, throttling,
/// timeouts and connection errors heal; refusals of this request or identity do not.
pub(crate) fn is_transient(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(s) => matches!(s.code, 408 | 429 | 500..=599),
        kube::Error::HyperError(_)
        | kube::Error::Service(_)
        | kube::Error::ReadEvents(_)
        | kube::Error::SerdeError(_)
        | kube::Error::FromUtf8(_)
        | kube::Error::Auth(_) => true,
        _ => false,
    }
}

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

/// Held leadership: cancelled when lost; `is_valid` answers from local time alone.
#[derive(Debug, Clone)]
pub struct Leadership {
    lost: CancellationToken,
    epoch: Instant,
    valid_until_ms: Arc<AtomicU64>,
}

impl Leadership {
    /// A validity not renewed yet (invalid until [`Leadership::renewed`]): sharding keeps one
    /// for its member Lease.
    pub(crate) fn unrenewed() -> Self {
        Self {
            lost: CancellationToken::new(),
            epoch: Instant::now(),
            valid_until_ms: Arc::new(AtomicU64::new(0)),
        }
    }

    /// A validity that shares this one's renewals (it lapses when this one does, and a renewal
    /// extends both) but can also be lost on its own: sharding gives one to each watch it holds,
    /// all renewed through the replica's member Lease.
    pub(crate) fn child(&self) -> Self {
        Self {
            lost: self.lost.child_token(),
            epoch: self.epoch,
            valid_until_ms: self.valid_until_ms.clone(),
        }
    }

    /// Ends the validity at once (the Lease was taken over or released).
    pub(crate) fn lose(&self) {
        self.lost.cancel();
    }

    /// Resolves when leadership is lost.
    pub async fn lost(&self) {
        self.lost.cancelled().await;
    }

    /// Whether this replica may still act as leader: its last renewal is recent enough.
    pub fn is_valid(&self) -> bool {
        !self.lost.is_cancelled()
            && (self.epoch.elapsed().as_millis() as u64)
                < self.valid_until_ms.load(Ordering::Relaxed)
    }

    /// Records a renewal sent at `at`: valid until four fifths of `lease_duration` later.
    pub(crate) fn renewed(&self, lease_duration: Duration, at: Instant) {
        // A safety margin of a fifth of the lease: stop publishing before anyone may take over.
        let until = at.duration_since(self.epoch) + lease_duration.mul_f32(0.8);
        self.valid_until_ms
            .store(until.as_millis() as u64, Ordering::Relaxed);
    }
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// Waits for leadership when the configuration asks for leader election (with a client of its
/// own, see [`kubernetes::client`]); `None` when it does not.
pub async fn elect(config: &Config) -> Result<Option<Leadership>> {
    if !config.leader_election.enabled {
        return Ok(None);
    }
    let client = kubernetes::client(&config.kubernetes).await?;
    let settings = Settings::new(&config.leader_election, &config.cluster, |name| {
        std::env::var(name).ok()
    });
    Ok(Some(acquire(client, settings).await?))
}

/// Waits until this replica holds the lease, then keeps renewing it in the background.
/// Transient API errors while waiting are logged and retried with backoff; only an error that
/// will not heal (RBAC, a missing namespace, bad credentials) is returned.
pub async fn acquire(client: Client, s: Settings) -> Result<Leadership> {
    let api: Api<Lease> = Api::namespaced(client, &s.namespace);
    let leadership = Leadership::unrenewed();
    // The holder's lease is judged expired by how long its resourceVersion has not changed, as
    // observed here: no clock comparison with other nodes.
    let mut observed: Option<(String, Instant)> = None;
    let mut backoff = Backoff::default();
    info!(lease = %s.name, namespace = %s.namespace, identity = %s.identity, "waiting for leadership");
    loop {
        let delay = match try_acquire(&api, &s, &mut observed).await {
            Ok(true) => break,
            Ok(false) => {
                backoff.reset();
                s.retry_period
            }
            Err(source) if is_transient(&source) => {
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
    leadership.renewed(s.lease_duration, Instant::now());
    info!(lease = %s.name, identity = %s.identity, "leadership acquired");
    tokio::spawn(renew(api, s, leadership.clone()));
    Ok(leadership)
}

/// One attempt to take the lease: true when taken, false when someone else holds it (or won a
/// race for it).
async fn try_acquire(
    api: &Api<Lease>,
    s: &Settings,
    observed: &mut Option<(String, Instant)>,
) -> Result<bool, kube::Error> {
    let lost_race = |e: &kube::Error| matches!(e, kube::Error::Api(e) if e.code == 409);
    let Some(current) = api.get_opt(&s.name).await? else {
        return match api
            .create(&PostParams::default(), &lease_for(s, None, 0))
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if lost_race(&e) => Ok(false),
            Err(e) => Err(e),
        };
    };
    let spec = current.spec.clone().unwrap_or_default();
    let rv = current
        .metadata
        .resource_version
        .clone()
        .unwrap_or_default();
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if observed.as_ref().is_none_or(|(seen, _)| *seen != rv) {
        *observed = Some((rv.clone(), Instant::now()));
    }
    let held_for = observed
        .as_ref()
        .map(|(_, at)| at.elapsed())
        .unwrap_or_default();
    let duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(15).max(1) as u64);
    if !(holder.is_empty() || holder == s.identity || held_for >= duration) {
        return Ok(false);
    }
    let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(holder != s.identity);
    let lease = lease_for(s, Some(rv), transitions);
    match api.replace(&s.name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        // Deleted since the read: also a race, the next attempt creates it.
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) if lost_race(&e) => Ok(false),
        Err(e) => Err(e),
    }
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

fn lease_for(s: &Settings, resource_version: Option<String>, transitions: i32) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(s.name.clone()),
            namespace: Some(s.namespace.clone()),
            resource_version,
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(s.identity.clone()),
            lease_duration_seconds: Some(s.lease_duration.as_secs() as i32),
            acquire_time: Some(now()),
            renew_time: Some(now()),
            lease_transitions: Some(transitions),
            ..Default::default()
        }),
    }
}

/// Renews every retry period; leadership is lost when the lease is held by someone else or when
/// renewals have failed for longer than the lease is valid.
async fn renew(api: Api<Lease>, s: Settings, leadership: Leadership) {
    loop {
        tokio::time::sleep(s.retry_period).await;
        if !leadership.is_valid() {
            warn!(lease = %s.name, "lease not renewed in time: leadership lost");
            break;
        }
        let at = Instant::now();
        let current = match api.get_opt(&s.name).await {
            Ok(Some(l)) => l,
            Ok(None) => {
                warn!(lease = %s.name, "lease deleted: leadership lost");
                break;
            }
            Err(e) => {
                warn!(error = %e, "lease renewal failed, retrying");
                continue;
            }
        };
        let mut spec = current.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(&s.identity) {
            warn!(lease = %s.name, holder = spec.holder_identity.as_deref().unwrap_or(""), "lease taken over: leadership lost");
            break;
        }
        spec.renew_time = Some(now());
        let lease = Lease {
            metadata: current.metadata.clone(),
            spec: Some(spec),
        };
        match api.replace(&s.name, &PostParams::default(), &lease).await {
            Ok(_) => leadership.renewed(s.lease_duration, at),
            Err(e) => warn!(error = %e, "lease renewal failed, retrying"),
        }
    }
    leadership.lost.cancel();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_validity_lapses_and_renews_with_its_parent_and_is_lost_alone() {
        let member = Leadership::unrenewed();
        let (a, b) = (member.child(), member.child());
        assert!(!a.is_valid(), "nothing renewed yet");
        member.renewed(Duration::from_secs(10), Instant::now());
        assert!(a.is_valid() && b.is_valid());
        a.lose();
        assert!(!a.is_valid() && b.is_valid() && member.is_valid());
        // Four fifths of a short lease later, every child lapses with the parent.
        member.renewed(Duration::from_millis(20), Instant::now());
        std::thread::sleep(Duration::from_millis(30));
        assert!(!b.is_valid() && !member.is_valid());
    }

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(
            serde_json::from_value(serde_json::json!({"code": code, "message": "m"})).unwrap(),
        ))
    }

    #[test]
    fn server_errors_throttling_and_broken_connections_are_transient() {
        for code in [408, 429, 500, 502, 503, 504] {
            assert!(is_transient(&api(code)), "{code}");
        }
        let reset = std::io::Error::other("connection reset");
        assert!(is_transient(&kube::Error::ReadEvents(reset)));
        assert!(is_transient(&kube::Error::Service(
            "connection refused".into()
        )));
        for code in [400, 401, 403, 404, 422] {
            assert!(!is_transient(&api(code)), "{code}");
        }
        assert!(!is_transient(&kube::Error::TlsRequired));
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
