//! A snapshot request: a ConfigMap labelled [`LABEL`]`=true` in the bridge's namespace. Its data
//! says what to snapshot; parsing checks it without I/O, and every refusal names the data key.
//!
//! ```yaml
//! apiVersion: v1
//! kind: ConfigMap
//! metadata:
//!   generateName: snapshot-
//!   labels: {kube-event-bridge.dev/snapshot-request: "true"}
//! data:
//!   resource: v1/configmaps     # apiVersion/plural, as in `resources[]`
//!   namespace: shop             # optional
//!   labelSelector: app=web      # optional, on top of the watch's own
//!   cluster: prod-eu1           # the fleet member; optional outside a fleet
//!   chunkSize: "500"            # optional: objects per LIST page, 1 to 10000
//!   prune: "true"               # optional: tombstones for keys the cluster no longer has
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;

/// The label that makes a ConfigMap a snapshot request.
pub const LABEL: &str = "kube-event-bridge.dev/snapshot-request";

/// The data keys a request may hold.
pub const KEYS: [&str; 6] = [
    "resource",
    "namespace",
    "labelSelector",
    "cluster",
    "chunkSize",
    "prune",
];

/// Objects per LIST page when the request does not say.
pub const DEFAULT_CHUNK: u32 = 500;
/// The largest `chunkSize`.
const MAX_CHUNK: u32 = 10_000;

/// Why a request cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A required key is missing.
    #[error("data.{0}: required")]
    Missing(&'static str),
    /// A key the request does not know.
    #[error("data.{key}: unknown key (known: {})", KEYS.join(", "))]
    Unknown {
        /// The key.
        key: String,
    },
    /// A value is not valid.
    #[error("data.{key}: {value:?} {why}")]
    Invalid {
        /// The key.
        key: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        why: &'static str,
    },
    /// The ConfigMap lacks a uid or a name (never the case for one read from the API server).
    #[error("metadata.{0}: missing")]
    Metadata(&'static str),
}

/// A parsed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The ConfigMap's uid: the snapshot's id.
    pub id: Arc<str>,
    /// The ConfigMap's name.
    pub name: String,
    /// `apiVersion/plural`.
    pub resource: String,
    /// The namespace, if the snapshot is limited to one.
    pub namespace: Option<String>,
    /// A label selector narrowing the snapshot.
    pub label_selector: Option<String>,
    /// The fleet member whose objects are asked for.
    pub cluster: Option<String>,
    /// Objects per LIST page.
    pub chunk: u32,
    /// Whether keys the compacted destination holds and the cluster no longer has get a
    /// tombstone.
    pub prune: bool,
}

/// Parses the request `config_map`.
pub fn parse(config_map: &ConfigMap) -> Result<Request, Error> {
    let meta = &config_map.metadata;
    let id = meta.uid.clone().ok_or(Error::Metadata("uid"))?;
    let name = meta.name.clone().ok_or(Error::Metadata("name"))?;
    let empty = BTreeMap::new();
    let data = config_map.data.as_ref().unwrap_or(&empty);
    if let Some(key) = data.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(Error::Unknown { key: key.clone() });
    }
    let get = |key: &str| {
        data.get(key)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    let resource = get("resource").ok_or(Error::Missing("resource"))?;
    if resource.split('/').count() < 2 || resource.split('/').any(str::is_empty) {
        return Err(Error::Invalid {
            key: "resource",
            value: resource,
            why: "is not apiVersion/plural (e.g. v1/configmaps, apps/v1/deployments)",
        });
    }
    let namespace = get("namespace");
    if let Some(ns) = &namespace
        && !crate::config::is_dns_label(ns)
    {
        return Err(Error::Invalid {
            key: "namespace",
            value: ns.clone(),
            why: "is not a namespace name (a DNS label)",
        });
    }
    let label_selector = get("labelSelector");
    let prune = prune(get("prune"))?;
    if prune && label_selector.is_some() {
        return Err(Error::Invalid {
            key: "prune",
            value: "true".into(),
            why: "cannot be combined with labelSelector: every key outside the selector would be pruned",
        });
    }
    Ok(Request {
        id: id.into(),
        name,
        resource,
        namespace,
        label_selector,
        cluster: get("cluster"),
        chunk: chunk(get("chunkSize"))?,
        prune,
    })
}

/// `prune`: `true` or `false`, `false` when absent.
fn prune(value: Option<String>) -> Result<bool, Error> {
    match value.as_deref() {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(_) => Err(Error::Invalid {
            key: "prune",
            value: value.unwrap_or_default(),
            why: "is not true or false",
        }),
    }
}

/// `chunkSize`: a number from 1 to 10,000, [`DEFAULT_CHUNK`] when absent.
fn chunk(value: Option<String>) -> Result<u32, Error> {
    let Some(value) = value else {
        return Ok(DEFAULT_CHUNK);
    };
    match value.parse::<u32>() {
        Ok(n) if (1..=MAX_CHUNK).contains(&n) => Ok(n),
        _ => Err(Error::Invalid {
            key: "chunkSize",
            value,
            why: "is not a number from 1 to 10000",
        }),
    }
}

/// What the `snapshot` command asks for.
#[derive(Debug, Clone, Default)]
pub struct Ask {
    /// `apiVersion/plural`.
    pub resource: String,
    /// Only this namespace.
    pub namespace: Option<String>,
    /// Only the objects matching this label selector.
    pub selector: Option<String>,
    /// The fleet member.
    pub cluster: Option<String>,
    /// Tombstones for the keys the compacted destination holds and the cluster no longer has.
    pub prune: bool,
}

/// A request ConfigMap in `namespace` asking `ask` of the namespace `scope` (or every one),
/// its id and name left to the API server.
pub fn build(namespace: &str, scope: Option<&str>, ask: &Ask) -> ConfigMap {
    let mut data = BTreeMap::from([("resource".to_string(), ask.resource.clone())]);
    let optional = [
        ("namespace", scope),
        ("labelSelector", ask.selector.as_deref()),
        ("cluster", ask.cluster.as_deref()),
        ("prune", ask.prune.then_some("true")),
    ];
    for (key, value) in optional {
        if let Some(v) = value {
            data.insert(key.to_string(), v.to_string());
        }
    }
    ConfigMap {
        metadata: ObjectMeta {
            generate_name: Some("snapshot-".into()),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([(LABEL.to_string(), "true".to_string())])),
            ..ObjectMeta::default()
        },
        data: Some(data),
        ..ConfigMap::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(data: &[(&str, &str)]) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some("snapshot-x".into()),
                uid: Some("u-1".into()),
                ..ObjectMeta::default()
            },
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..ConfigMap::default()
        }
    }

    #[test]
    fn a_full_request_is_parsed() {
        let parsed = parse(&request(&[
            ("resource", "apps/v1/deployments"),
            ("namespace", "shop"),
            ("labelSelector", "app=web"),
            ("cluster", "prod"),
            ("chunkSize", "50"),
        ]))
        .unwrap();
        assert_eq!(
            parsed,
            Request {
                id: "u-1".into(),
                name: "snapshot-x".into(),
                resource: "apps/v1/deployments".into(),
                namespace: Some("shop".into()),
                label_selector: Some("app=web".into()),
                cluster: Some("prod".into()),
                chunk: 50,
                prune: false,
            }
        );
    }

    #[test]
    fn defaults_fill_what_is_left_out() {
        let parsed = parse(&request(&[("resource", "v1/configmaps")])).unwrap();
        assert_eq!(parsed.chunk, DEFAULT_CHUNK);
        assert_eq!((parsed.namespace, parsed.cluster), (None, None));
    }

    #[test]
    fn each_refusal_names_its_key() {
        let refused = |data: &[(&str, &str)]| parse(&request(data)).unwrap_err().to_string();
        assert_eq!(refused(&[]), "data.resource: required");
        assert!(
            refused(&[("resource", "configmaps")]).starts_with("data.resource: \"configmaps\"")
        );
        assert!(
            refused(&[("resource", "v1/configmaps"), ("namespace", "Shop_1")])
                .starts_with("data.namespace: ")
        );
        assert!(
            refused(&[("resource", "v1/configmaps"), ("chunkSize", "0")])
                .starts_with("data.chunkSize: \"0\"")
        );
        assert!(
            refused(&[("resource", "v1/configmaps"), ("prune", "yes")])
                .starts_with("data.prune: \"yes\" is not true or false")
        );
        assert!(
            refused(&[
                ("resource", "v1/configmaps"),
                ("prune", "true"),
                ("labelSelector", "a=b")
            ])
            .starts_with("data.prune: \"true\" cannot be combined with labelSelector")
        );
        assert!(
            refused(&[("resource", "v1/configmaps"), ("flavour", "x")])
                .starts_with("data.flavour: unknown key")
        );
    }

    #[test]
    fn a_built_request_parses_back() {
        let ask = Ask {
            resource: "v1/configmaps".into(),
            cluster: Some("prod".into()),
            prune: true,
            ..Ask::default()
        };
        let mut built = build("bridge", Some("shop"), &ask);
        assert_eq!(built.metadata.labels.as_ref().unwrap()[LABEL], "true");
        built.metadata.name = Some("snapshot-abc".into());
        built.metadata.uid = Some("u-2".into());
        let parsed = parse(&built).unwrap();
        assert_eq!(parsed.namespace.as_deref(), Some("shop"));
        assert_eq!(parsed.cluster.as_deref(), Some("prod"));
        assert_eq!(parsed.label_selector, None);
        assert!(parsed.prune);
    }
}
