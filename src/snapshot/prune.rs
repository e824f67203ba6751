//! A snapshot's `prune`: after its objects, a tombstone for every key the compacted
//! destination still holds for an object the cluster no longer has, so that the destination
//! converges to the cluster's state. Whether a request may prune on a watch is decided here,
//! without I/O, before its walk starts; every refusal names the setting that forbids it.

use crate::config::RecordKey;
use crate::sink::Owner;
use crate::supervisor::DemandPort;

use super::request::Request;

/// What a snapshot prunes: the keys of `owner`'s objects in `destination`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prune {
    /// The topic.
    pub destination: String,
    /// Whose keys they are.
    pub owner: Owner,
}

/// What `request` prunes on the watch of `port` (in `namespace`, when the watch has one);
/// why it may not.
pub fn plan(
    port: &DemandPort,
    namespace: Option<&str>,
    request: &Request,
) -> Result<Prune, String> {
    let (info, resource) = (&port.info, &request.resource);
    if port.sink.compaction().is_none() {
        return Err(format!(
            "data.prune: the {} sink keeps no keys to prune (prune needs the kafka sink)",
            port.sink.name()
        ));
    }
    if info.key != RecordKey::NamespacedName {
        return Err(format!(
            "data.prune: {resource} is keyed by uid; prune needs `key: namespacedName` (a topic keyed by uid holds a new key for every object ever created)"
        ));
    }
    if !info.tombstones {
        return Err(format!(
            "data.prune: {resource} has `tombstones: false`; prune needs `tombstones: true` (without them a deleted object's key stays in the topic anyway)"
        ));
    }
    let target = &port.target;
    if target.label_selector.is_some() || target.field_selector.is_some() {
        return Err(format!(
            "data.prune: the watch of {resource} has a label or field selector: a key outside it cannot be told from a deleted object's"
        ));
    }
    let namespace = request.namespace.as_deref().or(namespace);
    let destination = crate::demand::destination(&*port.sink, info, namespace)
        .ok_or_else(|| format!("data.prune: {}", crate::demand::NO_DESTINATION))?;
    Ok(Prune {
        destination,
        owner: Owner {
            cluster: info.cluster.to_string(),
            api_version: info.api_version.clone(),
            resource: info.resource.clone(),
            namespace: namespace.map(Into::into),
        },
    })
}
