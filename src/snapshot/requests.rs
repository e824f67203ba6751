//! Serves snapshot requests: follows the request ConfigMaps of the bridge's namespace and starts
//! the walk of each on the replica running the watch it names. Every replica follows them; only
//! the one running the watch walks (with sharding, the watch's owner; after a hand-off, the new
//! owner resumes from the recorded progress). A request that cannot be served is marked failed,
//! naming why.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{Config as WatcherConfig, Event, watcher};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::prune::{self, Prune};
use super::record::{self, Phase, Progress};
use super::request::{self, LABEL, Request};
use super::walk::Walk;
use crate::admin;
use crate::supervisor::WatchHandle;

/// Where a request goes.
#[derive(Debug)]
enum Route<'a> {
    /// To this replica's watch.
    Here(&'a WatchHandle),
    /// Not here: another replica runs the watch, or it has not started yet.
    Elsewhere,
    /// Nowhere: the request cannot be served, for this reason.
    Refused(String),
}

/// A walk that ended: its request's uid and the phase it reached.
type Ended = (String, Phase);

/// The request follower of one bridge.
pub struct Requests {
    /// The requests' namespace.
    api: Api<ConfigMap>,
    /// The running watches and the snapshot counters.
    admin: Arc<admin::State>,
    /// Whether the bridge watches a fleet (a request must then name its cluster).
    fleet: bool,
    /// The requests, by uid.
    known: BTreeMap<String, ConfigMap>,
    /// The requests of a list going on (they replace `known` once it is complete).
    relisted: Option<BTreeMap<String, ConfigMap>>,
    /// The walks going on here, by request uid.
    walks: HashMap<String, JoinHandle<()>>,
    /// Walks that ended, by request uid, with the phase they reached.
    ended: (mpsc::UnboundedSender<Ended>, mpsc::UnboundedReceiver<Ended>),
    /// Requests whose walk ended here complete or failed: not walked again while the watch
    /// event of their final progress is on its way.
    finished: HashSet<String>,
}

impl Requests {
    /// A follower of the requests in `api`'s namespace.
    pub fn new(api: Api<ConfigMap>, admin: Arc<admin::State>, fleet: bool) -> Self {
        Self {
            api,
            admin,
            fleet,
            known: BTreeMap::new(),
            relisted: None,
            walks: HashMap::new(),
            ended: mpsc::unbounded_channel(),
            finished: HashSet::new(),
        }
    }

    /// Follows the requests until `stop`.
    pub async fn serve(mut self, stop: CancellationToken) {
        let config = WatcherConfig::default().labels(&format!("{LABEL}=true"));
        // The watcher yields `Init` before every list, even one that then fails, and its backoff
        // starts over at each item: without `Init`, a refused list backs off as it should.
        let mut events = watcher(self.api.clone(), config)
            .filter(|e| futures::future::ready(!matches!(e, Ok(Event::Init))))
            .default_backoff()
            .boxed();
        let mut changed = self.admin.subscribe_watches();
        let mut failing = false;
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                event = events.next() => match event {
                    Some(Ok(event)) => {
                        failing &= matches!(event, Event::InitApply(_));
                        self.apply(event);
                    }
                    Some(Err(e)) => {
                        if !failing {
                            warn!(error = %e, "snapshot requests cannot be read (RBAC: list and watch ConfigMaps in this namespace); retrying");
                        }
                        failing = true;
                        self.relisted = None;
                        continue;
                    }
                    None => break,
                },
                Ok(()) = changed.changed() => {}
                Some((uid, phase)) = self.ended.1.recv() => {
                    self.walks.remove(&uid);
                    if phase.is_final() {
                        self.finished.insert(uid);
                    }
                }
            }
            self.reconcile().await;
        }
        for (_, walk) in self.walks.drain() {
            walk.abort();
        }
    }

    /// Takes one event of the requests' watch.
    fn apply(&mut self, event: Event<ConfigMap>) {
        match event {
            Event::Apply(cm) => {
                if let Some(uid) = cm.metadata.uid.clone() {
                    self.known.insert(uid, cm);
                }
            }
            Event::InitApply(cm) => {
                if let Some(uid) = cm.metadata.uid.clone() {
                    self.relisted.get_or_insert_default().insert(uid, cm);
                }
            }
            Event::Delete(cm) => {
                if let Some(uid) = &cm.metadata.uid {
                    self.known.remove(uid);
                    self.stop_walk(uid, &cm);
                }
            }
            Event::Init => {}
            // A complete list replaces what was known; a request gone meanwhile stops its walk.
            Event::InitDone => {
                let listed = self.relisted.take().unwrap_or_default();
                let gone = std::mem::replace(&mut self.known, listed);
                for (uid, cm) in gone {
                    if !self.known.contains_key(&uid) {
                        self.stop_walk(&uid, &cm);
                    }
                }
            }
        }
    }

    /// Stops the walk of a request that was deleted, if one goes on here.
    fn stop_walk(&mut self, uid: &str, cm: &ConfigMap) {
        self.finished.remove(uid);
        if let Some(walk) = self.walks.remove(uid) {
            info!(
                request = cm.metadata.name.as_deref().unwrap_or_default(),
                "snapshot request deleted: its walk stops"
            );
            walk.abort();
        }
    }

    /// Starts the walk of every request this replica should serve, and refuses those that
    /// cannot be served.
    async fn reconcile(&mut self) {
        let handles = self.admin.watch_handles();
        let mut refusals = Vec::new();
        for (uid, cm) in &self.known {
            let progress = record::read(cm.metadata.annotations.as_ref());
            let finished = progress.phase.is_final() || self.finished.contains(uid);
            if self.walks.contains_key(uid) || finished {
                continue;
            }
            let refused = |why: String| (cm.metadata.clone(), why);
            let request = match request::parse(cm) {
                Ok(request) => request,
                Err(e) => {
                    refusals.push(refused(e.to_string()));
                    continue;
                }
            };
            match route(&request, &handles, self.fleet) {
                Route::Here(handle) => match serving(handle, &request) {
                    Ok(prune) => {
                        let walk = self.walk(handle, request, progress, prune);
                        self.walks.insert(uid.clone(), walk);
                    }
                    Err(why) => refusals.push(refused(why)),
                },
                Route::Elsewhere => {}
                Route::Refused(why) => refusals.push(refused(why)),
            }
        }
        for (meta, why) in refusals {
            self.refuse(meta, why).await;
        }
    }

    /// Marks a request failed with `why`, on the version of it this replica saw: of the
    /// replicas (and repeated reconciles) that refuse one request, one records and counts it.
    async fn refuse(&self, meta: ObjectMeta, why: String) {
        let name = meta.name.unwrap_or_default();
        let progress = Progress {
            phase: Phase::Failed,
            message: Some(why.clone()),
            ..Progress::default()
        };
        let mut patch = record::patch(&progress);
        patch["metadata"]["resourceVersion"] = meta.resource_version.into();
        match self
            .api
            .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => {
                warn!(request = %name, error = %why, "snapshot request refused");
                self.admin.snapshots.ended[1].fetch_add(1, Ordering::Relaxed);
            }
            // Recorded by another replica, or changed since: the next reconcile sees it.
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => warn!(request = %name, error = %e, "snapshot refusal not recorded"),
        }
    }

    /// Starts the walk of `request` on the watch of `handle`.
    fn walk(
        &self,
        handle: &WatchHandle,
        request: Request,
        progress: Progress,
        prune: Option<Prune>,
    ) -> JoinHandle<()> {
        let port = handle
            .demand
            .clone()
            .expect("a running watch has a demand port");
        info!(request = %request.name, watch = %port.key.description, resumed = progress.begun, "snapshot starts");
        let walk = Walk {
            port,
            cluster_wide: handle.namespace.is_none(),
            request,
            requests: self.api.clone(),
            progress,
            prune,
            admin: self.admin.clone(),
        };
        let uid = walk.request.id.to_string();
        let ended = self.ended.0.clone();
        let admin = self.admin.clone();
        tokio::spawn(async move {
            admin.snapshots.running.fetch_add(1, Ordering::Relaxed);
            let phase = walk.run().await;
            admin.snapshots.running.fetch_sub(1, Ordering::Relaxed);
            match phase {
                Phase::Complete => admin.snapshots.ended[0].fetch_add(1, Ordering::Relaxed),
                Phase::Failed => admin.snapshots.ended[1].fetch_add(1, Ordering::Relaxed),
                _ => 0,
            };
            let _ = ended.send((uid, phase));
        })
    }
}

/// Whether the watch of `handle` can serve `request`, and what it prunes (nothing unless
/// asked to); why it cannot, naming the setting.
fn serving(handle: &WatchHandle, request: &Request) -> Result<Option<Prune>, String> {
    let Some(port) = &handle.demand else {
        return Ok(None);
    };
    let namespace = request.namespace.as_deref().or(handle.namespace.as_deref());
    if crate::demand::destination(&*port.sink, &port.info, namespace).is_none() {
        return Err(crate::demand::NO_DESTINATION.to_string());
    }
    let asked = request.prune.then_some(port);
    asked
        .map(|port| prune::plan(port, handle.namespace.as_deref(), request))
        .transpose()
}

/// Where `request` goes, given this replica's running watches.
fn route<'a>(request: &Request, handles: &'a [WatchHandle], fleet: bool) -> Route<'a> {
    if fleet && request.cluster.is_none() {
        return Route::Refused("data.cluster: required, the bridge watches a fleet".into());
    }
    let of_resource: Vec<&WatchHandle> = handles
        .iter()
        .filter(|h| h.resource == request.resource && h.demand.is_some())
        .filter(|h| request.cluster.as_deref().is_none_or(|c| *h.cluster == *c))
        .collect();
    if request.namespace.is_none() && of_resource.iter().any(|h| h.namespace.is_some()) {
        return Route::Refused(format!(
            "data.namespace: required, {} is watched per namespace (kube-event-bridge snapshot writes one request per namespace)",
            request.resource
        ));
    }
    let exact = of_resource
        .iter()
        .find(|h| h.namespace.is_some() && h.namespace == request.namespace);
    let wide = of_resource.iter().find(|h| h.namespace.is_none());
    match exact.or(wide) {
        Some(handle) => Route::Here(handle),
        None => Route::Elsewhere,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::scripted::ScriptedSink;
    use crate::status::Status;

    fn handle(cluster: &str, resource: &str, namespace: Option<&str>) -> WatchHandle {
        WatchHandle {
            cluster: cluster.into(),
            resource: resource.into(),
            namespace: namespace.map(Into::into),
            status: Arc::new(Status::default()),
            demand: None,
        }
    }

    fn request(resource: &str, namespace: Option<&str>, cluster: Option<&str>) -> Request {
        Request {
            id: "u".into(),
            name: "snapshot-x".into(),
            resource: resource.into(),
            namespace: namespace.map(Into::into),
            label_selector: None,
            cluster: cluster.map(Into::into),
            chunk: 10,
            prune: false,
        }
    }

    /// Handles as running watches have them: with a port (a test double is enough to route).
    fn routable(handles: Vec<WatchHandle>) -> Vec<WatchHandle> {
        handles.into_iter().map(with_port).collect()
    }

    fn with_port(mut h: WatchHandle) -> WatchHandle {
        let (tx, _rx) = mpsc::channel(1);
        let client =
            kube::Client::try_from(kube::Config::new("http://127.0.0.1:1".parse().unwrap()))
                .unwrap();
        let target = crate::watch::Target {
            api: kube::Api::all_with(
                client,
                &kube::discovery::ApiResource::erase::<ConfigMap>(&()),
            ),
            types: kube::api::TypeMeta::default(),
            label_selector: None,
            field_selector: None,
            page_size: 1,
            page_bytes: 1,
            watch_timeout_secs: 1,
            not_found: Arc::default(),
            resource_deleted: Arc::default(),
            listing: Arc::new(crate::watch::Listing::new(
                "v1/configmaps",
                crate::config::InitialList::default(),
            )),
            history: Arc::default(),
        };
        h.demand = Some(crate::supervisor::DemandPort {
            key: crate::checkpoint::WatchKey::new(&h.cluster, "v1", "configmaps", None, None, None),
            target,
            queue: tx.downgrade(),
            stopped: CancellationToken::new(),
            sink: Arc::new(ScriptedSink::new(true, false)),
            info: crate::encode::tests::info("", "v1", "ConfigMap", "configmaps", true),
        });
        h
    }

    fn routed_to(route: Route<'_>) -> Option<(String, Option<String>)> {
        match route {
            Route::Here(h) => Some((h.cluster.to_string(), h.namespace.clone())),
            Route::Elsewhere => None,
            Route::Refused(why) => panic!("refused: {why}"),
        }
    }

    #[tokio::test]
    async fn a_cluster_wide_watch_serves_any_namespace() {
        let handles = routable(vec![handle("dev", "v1/configmaps", None)]);
        let r = route(
            &request("v1/configmaps", Some("shop"), None),
            &handles,
            false,
        );
        assert_eq!(routed_to(r), Some(("dev".into(), None)));
        let r = route(&request("v1/secrets", None, None), &handles, false);
        assert_eq!(routed_to(r), None);
    }

    #[tokio::test]
    async fn a_per_namespace_watch_serves_its_own_namespace_only() {
        let handles = routable(vec![
            handle("dev", "v1/configmaps", Some("a")),
            handle("dev", "v1/configmaps", Some("b")),
        ]);
        let r = route(&request("v1/configmaps", Some("b"), None), &handles, false);
        assert_eq!(routed_to(r), Some(("dev".into(), Some("b".into()))));
        let r = route(&request("v1/configmaps", Some("c"), None), &handles, false);
        assert_eq!(routed_to(r), None, "another replica may run it");
        let Route::Refused(why) = route(&request("v1/configmaps", None, None), &handles, false)
        else {
            panic!("a request without a namespace cannot name one watch");
        };
        assert!(why.starts_with("data.namespace: required"), "{why}");
    }

    #[tokio::test]
    async fn a_fleet_routes_by_cluster_and_requires_one() {
        let handles = routable(vec![
            handle("east", "v1/configmaps", None),
            handle("west", "v1/configmaps", None),
        ]);
        let r = route(
            &request("v1/configmaps", None, Some("west")),
            &handles,
            true,
        );
        assert_eq!(routed_to(r), Some(("west".into(), None)));
        let Route::Refused(why) = route(&request("v1/configmaps", None, None), &handles, true)
        else {
            panic!("a fleet's request must name its cluster");
        };
        assert!(why.starts_with("data.cluster: required"), "{why}");
    }

    #[test]
    fn a_watch_not_started_yet_is_not_routed_to() {
        let handles = vec![handle("dev", "v1/configmaps", None)];
        let r = route(&request("v1/configmaps", None, None), &handles, false);
        assert_eq!(routed_to(r), None);
    }

    /// `h` with its port's sink and resource replaced.
    fn with_sink(mut h: WatchHandle, sink: ScriptedSink, extra: &str) -> WatchHandle {
        let port = h.demand.as_mut().expect("a port");
        port.sink = Arc::new(sink);
        port.info = crate::encode::tests::configmaps(extra);
        h
    }

    #[tokio::test]
    async fn prune_is_planned_only_where_the_topic_keeps_the_objects_keys() {
        let h = with_port(handle("dev", "v1/configmaps", Some("shop")));
        let mut asked = request("v1/configmaps", None, None);
        assert_eq!(serving(&h, &asked), Ok(None), "not asked for");
        asked.prune = true;
        let refused = |h: &WatchHandle| serving(h, &asked).unwrap_err();
        let why = refused(&h);
        assert!(
            why.starts_with("data.prune: the scripted sink keeps no keys"),
            "{why}"
        );
        let compacted = || ScriptedSink::new(true, true).compacted();
        let why = refused(&with_sink(h.clone(), compacted(), ""));
        assert!(why.contains("keyed by uid"), "{why}");
        let by_name = ", key: namespacedName";
        let why = refused(&with_sink(h.clone(), compacted(), by_name));
        assert!(why.contains("`tombstones: false`"), "{why}");
        let keyed = ", key: namespacedName, tombstones: true";
        let ready = with_sink(h.clone(), compacted(), keyed);
        let planned = serving(&ready, &asked).unwrap().expect("a plan");
        assert_eq!(planned.destination, "configmaps.shop");
        assert_eq!(
            (
                planned.owner.cluster.as_str(),
                planned.owner.resource.as_str()
            ),
            ("dev", "configmaps")
        );
        assert_eq!(planned.owner.namespace.as_deref(), Some("shop"));
        let mut selected = ready;
        selected.demand.as_mut().unwrap().target.label_selector = Some("app=web".into());
        let why = refused(&selected);
        assert!(why.contains("label or field selector"), "{why}");
    }

    #[tokio::test]
    async fn a_watch_whose_destination_names_the_object_serves_no_snapshot() {
        let per_namespace = ", topic: \"k8s.{namespace}\"";
        let wide = with_sink(
            with_port(handle("dev", "v1/configmaps", None)),
            ScriptedSink::new(true, false),
            per_namespace,
        );
        let every = request("v1/configmaps", None, None);
        let why = serving(&wide, &every).unwrap_err();
        assert!(why.contains("names the object"), "{why}");
        let one = request("v1/configmaps", Some("shop"), None);
        assert_eq!(serving(&wide, &one), Ok(None), "one namespace: one topic");
    }
}
