//! `kube-event-bridge tail`: subscribes where the configuration publishes (each sink says where,
//! [`crate::sink::Settings::subscribe`]) and prints each event readably. The decoders are the
//! sinks' own, which the integration tests use as their consumer too.

use std::time::Duration;

use cloudevents::{AttributesReader, Data, Event};
use futures::StreamExt;

use crate::attribute;
use crate::clusters;
use crate::config::Config;
use crate::discovery::{self, ResolvedResource};
use crate::kubernetes;
use crate::sink;
use crate::supervisor::error_chain;

pub use crate::sink::decode::{NotCloudEvent, decode};
pub use crate::sink::kafka::{decode as decode_kafka, topic_pattern};
pub use crate::sink::nats::decode as decode_nats;

/// Errors of tailing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The sink has nothing to subscribe to, or the subscription failed.
    #[error(transparent)]
    Sink(#[from] sink::Error),
    /// The Kubernetes client could not be built.
    #[error(transparent)]
    Kubernetes(#[from] kubernetes::Error),
    /// Discovery failed.
    #[error(transparent)]
    Discovery(#[from] discovery::Error),
    /// A cluster of the fleet could not be named or reached.
    #[error(transparent)]
    Cluster(#[from] clusters::Error),
    /// No cluster of the fleet could be reached.
    #[error("no cluster of the fleet could be reached (see above): nothing to follow")]
    NothingToFollow,
}

/// How to tail.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Print objects too.
    pub verbose: bool,
    /// Start at the oldest retained event.
    pub from_beginning: bool,
    /// Stop after this many events.
    pub limit: Option<u64>,
    /// Stop after this long without an event.
    pub idle_timeout: Option<Duration>,
    /// Follow this cluster of the fleet only.
    pub cluster: Option<String>,
}

/// One readable line: time, change, subject, resourceVersion, origin, id; with `cluster`, the
/// event's cluster after the change (a fleet's events); with `verbose`, the object follows,
/// indented.
pub fn format(e: &Event, verbose: bool, cluster: bool) -> String {
    let ext = |k: &str| e.extension(k).map(|v| v.to_string()).unwrap_or_default();
    let change = e.ty().rsplit('.').next().unwrap_or_default();
    let time = e.time().map(|t| t.to_rfc3339()).unwrap_or_default();
    let member = if cluster {
        format!("{} ", ext(attribute::CLUSTER))
    } else {
        String::new()
    };
    let mut line = format!(
        "{time} {change:<8} {member}{}/{} {} rv={} origin={} id={}",
        ext(attribute::APIVERSION),
        ext(attribute::KIND),
        e.subject().unwrap_or_default(),
        ext(attribute::RESOURCEVERSION),
        ext(attribute::ORIGIN),
        e.id()
    );
    if verbose && let Some(Data::Json(v)) = e.data() {
        let pretty = serde_json::to_string_pretty(v).unwrap_or_default();
        for l in pretty.lines() {
            line.push_str("\n    ");
            line.push_str(l);
        }
    }
    line
}

/// What is followed in one cluster: its name (`None`: every cluster of the kubeconfig Secrets)
/// and its resources.
struct Followed {
    cluster: Option<String>,
    resources: Vec<ResolvedResource>,
}

/// Subscribes where `config` publishes and prints events until the limit or idle timeout. In a
/// fleet: the destinations of every configured cluster, each resolved through its own API
/// server, and with `clusterSecrets` those of any cluster (the resources watched there resolved
/// through the bridge's own cluster, `{cluster}` as a wildcard); or `options.cluster` alone.
pub async fn run(config: &Config, options: Options) -> Result<(), Error> {
    let followed = followed(config, options.cluster.as_deref()).await?;
    let scopes: Vec<sink::Scope<'_>> = followed
        .iter()
        .map(|f| sink::Scope {
            cluster: f.cluster.as_deref(),
            resources: &f.resources,
        })
        .collect();
    let settings = sink::settings(&config.sink)?;
    let mut messages = settings.subscribe(&scopes, options.from_beginning).await?;
    let idle = options.idle_timeout.unwrap_or(Duration::MAX);
    let fleet = config.fleet.is_fleet();
    let mut seen = 0u64;
    while let Ok(Some(message)) = tokio::time::timeout(idle, messages.next()).await {
        match message {
            // A destination shared by several clusters also carries the others' events.
            Ok(e) if !of_cluster(&e, options.cluster.as_deref()) => continue,
            Ok(e) => println!("{}", format(&e, options.verbose, fleet)),
            Err(e) => eprintln!("skipped message: {e}"),
        }
        seen += 1;
        if options.limit.is_some_and(|l| seen >= l) {
            break;
        }
    }
    Ok(())
}

/// Whether `e` is an event of `cluster` (of any cluster when `None`).
fn of_cluster(e: &Event, cluster: Option<&str>) -> bool {
    cluster.is_none_or(|c| {
        e.extension(attribute::CLUSTER)
            .is_some_and(|v| v.to_string() == c)
    })
}

/// The clusters to follow and their resources. A fleet's cluster that cannot be reached is left
/// out with a line on standard error (unless it is the one asked for): the others are followed.
async fn followed(config: &Config, only: Option<&str>) -> Result<Vec<Followed>, Error> {
    if !config.fleet.is_fleet() {
        if let Some(name) = only {
            clusters::named(config, name)?;
        }
        let client = kubernetes::client(&config.kubernetes).await?;
        let resources = discovery::resolve(&client, &config.resources).await?;
        return Ok(vec![Followed {
            cluster: Some(config.cluster.clone()),
            resources,
        }]);
    }
    let targets = match only {
        Some(name) => vec![clusters::named(config, name)?],
        None => clusters::configured(config),
    };
    let resolved = futures::future::join_all(targets.iter().map(|c| async move {
        let (_, _, resolution) = clusters::connect_and_resolve(config, c).await?;
        Ok::<_, clusters::Error>(resolution)
    }))
    .await;
    let mut followed = Vec::new();
    for (c, resolution) in targets.iter().zip(resolved) {
        match resolution {
            Ok(r) => followed.push(Followed {
                cluster: Some(c.name().to_string()),
                resources: r.resources,
            }),
            Err(e) if only.is_some() => return Err(e.into()),
            Err(e) => eprintln!("not following cluster {}: {}", c.name(), error_chain(&e)),
        }
    }
    let discovered = clusters::discovered_resources(config);
    if only.is_none() && !discovered.is_empty() {
        // The resources of clusters not known yet take their shape from the bridge's own
        // cluster.
        let hub = clusters::connect_with(&config.cluster, &config.kubernetes).await;
        let resolution = match hub {
            Ok((client, _)) => {
                clusters::resolve(config, &config.cluster, &client, &discovered).await
            }
            Err(e) => Err(e),
        };
        match resolution {
            Ok(r) => {
                for missing in r.missing {
                    eprintln!(
                        "not following in the clusters of kubeconfig Secrets: {missing} (resolved through the bridge's own cluster {})",
                        config.cluster
                    );
                }
                followed.push(Followed {
                    cluster: None,
                    resources: r.resources,
                });
            }
            Err(e) => eprintln!(
                "not following the clusters of kubeconfig Secrets: {}",
                error_chain(&e)
            ),
        }
    }
    if followed.is_empty() {
        return Err(Error::NothingToFollow);
    }
    Ok(followed)
}

#[cfg(test)]
mod tests {
    use cloudevents::{EventBuilder, EventBuilderV10};

    use super::*;

    fn event(cluster: &str) -> Event {
        EventBuilderV10::new()
            .id("u1:7:added")
            .source(format!("/k8s/{cluster}/api/v1/configmaps"))
            .ty("io.kubeeventbridge.object.added")
            .subject("shop/web")
            .extension(attribute::CLUSTER, cluster)
            .extension(attribute::APIVERSION, "v1")
            .extension(attribute::KIND, "ConfigMap")
            .extension(attribute::RESOURCEVERSION, "7")
            .extension(attribute::ORIGIN, "live")
            .build()
            .unwrap()
    }

    #[test]
    fn a_fleet_s_lines_name_the_cluster_a_single_cluster_s_do_not() {
        let e = event("east");
        assert_eq!(
            format(&e, false, false),
            " added    v1/ConfigMap shop/web rv=7 origin=live id=u1:7:added"
        );
        assert_eq!(
            format(&e, false, true),
            " added    east v1/ConfigMap shop/web rv=7 origin=live id=u1:7:added"
        );
    }

    #[test]
    fn one_cluster_is_followed_by_its_cluster_attribute() {
        assert!(of_cluster(&event("east"), None));
        assert!(of_cluster(&event("east"), Some("east")));
        assert!(!of_cluster(&event("west"), Some("east")));
        let mut anonymous = event("east");
        anonymous.remove_extension(attribute::CLUSTER);
        assert!(!of_cluster(&anonymous, Some("east")));
    }
}
