//! The workload: creates, updates and deletes chosen with the seed, over several resources (a
//! CRD among them), recording what the API server answered to each write. It deletes and
//! recreates names, moves objects in and out of a label selector, writes objects near the size
//! limit and deletes whole namespaces (as the namespace controller would: the objects, then the
//! namespace's finalizer).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::history::{Op, WatchKey, Write};

/// The group of the campaign's CRD.
pub const CRD_GROUP: &str = "chaos.kube-event-bridge.dev";
/// The plural of the campaign's CRD.
pub const CRD_PLURAL: &str = "gadgets";
/// The label the selected watch selects on (`{SELECT_LABEL}=in`).
pub const SELECT_LABEL: &str = "chaos-selected";
/// Values near the size limits: a ConfigMap of about 900 KB (the API server takes 1 MiB;
/// Kafka's and NATS's default message limit is 1 MB, so its event is sent truncated).
const LARGE_BYTES: usize = 900_000;

/// The resources written, each over its own namespaces.
#[derive(Debug, Clone)]
pub struct Layout {
    /// Namespaces of the plain ConfigMap watches (the first is never deleted).
    pub plain: Vec<String>,
    /// Namespace of the ConfigMap watch with a label selector.
    pub selected: String,
    /// Namespaces of the CRD's watches (the plain namespaces and the selected one).
    pub gadgets: Vec<String>,
}

impl Layout {
    /// Every watch a deployment runs.
    pub fn watches(&self) -> Vec<WatchKey> {
        let key = |resource: &str, ns: &String| WatchKey {
            resource: resource.into(),
            namespace: ns.clone(),
        };
        let mut w: Vec<WatchKey> = self.plain.iter().map(|n| key("configmaps", n)).collect();
        w.push(key("configmaps", &self.selected));
        w.extend(self.gadgets.iter().map(|n| key(CRD_PLURAL, n)));
        w
    }

    /// The `resources:` section of a bridge's configuration; `compacted` adds a topic keyed by
    /// name with tombstones for the plain ConfigMaps (Kafka).
    pub fn resources_yaml(&self, compacted: Option<&str>) -> String {
        let list = |v: &[String]| v.join(", ");
        let plain_extra = compacted.map_or(String::new(), |topic| {
            format!(", key: namespacedName, tombstones: true, topic: \"{topic}\"")
        });
        format!(
            "resources:\n\
             - {{apiVersion: v1, resource: configmaps, namespaces: [{}]{plain_extra}}}\n\
             - {{apiVersion: v1, resource: configmaps, namespaces: [{}], labelSelector: \"{SELECT_LABEL}=in\"}}\n\
             - {{apiVersion: {CRD_GROUP}/v1, resource: {CRD_PLURAL}, namespaces: [{}]}}\n",
            list(&self.plain),
            self.selected,
            list(&self.gadgets)
        )
    }
}

/// The API of the objects of `watch` (ConfigMaps or the campaign's CRD) in its namespace.
pub fn api(client: &kube::Client, watch: &WatchKey) -> Api<DynamicObject> {
    let resource = if watch.resource == CRD_PLURAL {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(CRD_GROUP, "v1", "Gadget"),
            CRD_PLURAL,
        )
    } else {
        ApiResource::erase::<ConfigMap>(&())
    };
    Api::namespaced_with(client.clone(), &watch.namespace, &resource)
}

/// What one object looks like to the workload.
#[derive(Debug, Clone)]
struct Live {
    uid: String,
    selected: bool,
}

/// What the workload wrote, shared with the checker and the nemesis.
#[derive(Debug, Default)]
pub struct Ledger {
    /// Acknowledged writes, in order.
    pub writes: Vec<Write>,
    /// Objects with a write of unknown outcome.
    pub uncertain: BTreeSet<(WatchKey, String)>,
    /// Writes refused or failed, by reason (for the report).
    pub failures: BTreeMap<String, u64>,
}

/// The workload of one round.
pub struct Workload {
    client: kube::Client,
    layout: Layout,
    rng: StdRng,
    started: Instant,
    objects: BTreeMap<WatchKey, BTreeMap<String, Live>>,
    deleted_namespaces: BTreeSet<String>,
    next_name: u64,
    /// When the write in progress was sent (milliseconds since the round started).
    sent_ms: u64,
    /// The ledger.
    pub ledger: Arc<Mutex<Ledger>>,
    /// Set by the nemesis while the API server is down on purpose: no writes meanwhile.
    pub hold: Arc<AtomicBool>,
}

impl Workload {
    /// A workload over `layout`, its choices made by `seed`.
    pub fn new(client: kube::Client, layout: Layout, seed: u64, started: Instant) -> Self {
        Workload {
            client,
            layout,
            rng: StdRng::seed_from_u64(seed),
            started,
            objects: BTreeMap::new(),
            deleted_namespaces: BTreeSet::new(),
            next_name: 0,
            sent_ms: 0,
            ledger: Arc::default(),
            hold: Arc::default(),
        }
    }

    /// Writes until `deadline`, about `rate` writes per second.
    pub async fn run(&mut self, deadline: Instant, rate: u32) {
        let pause = Duration::from_millis(1000 / u64::from(rate.max(1)));
        let mut namespace_deleted = false;
        while Instant::now() < deadline {
            if self.hold.load(Ordering::Acquire) {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            let roll = self.rng.random_range(0..1000);
            let late = deadline.saturating_duration_since(Instant::now()) < Duration::from_secs(20);
            if roll == 0 && !namespace_deleted && !late && self.layout.plain.len() > 1 {
                namespace_deleted = true;
                let ns = self.layout.plain[self.layout.plain.len() - 1].clone();
                self.delete_namespace(&ns).await;
            } else {
                self.step().await;
            }
            let jitter = self.rng.random_range(0..=pause.as_millis() as u64);
            tokio::time::sleep(Duration::from_millis(jitter) + pause / 2).await;
        }
    }

    /// One write chosen at random.
    async fn step(&mut self) {
        let watches: Vec<WatchKey> = self
            .layout
            .watches()
            .into_iter()
            .filter(|w| !self.deleted_namespaces.contains(&w.namespace))
            .collect();
        let watch = watches[self.rng.random_range(0..watches.len())].clone();
        let count = self.objects.get(&watch).map_or(0, BTreeMap::len);
        let roll = self.rng.random_range(0..100);
        let pick = |this: &mut Self| -> Option<String> {
            let names: Vec<&String> = this.objects.get(&watch)?.keys().collect();
            (!names.is_empty()).then(|| names[this.rng.random_range(0..names.len())].clone())
        };
        match roll {
            _ if count < 3 || (roll < 25 && count < 40) => self.create(&watch, None).await,
            25..=69 => {
                if let Some(name) = pick(self) {
                    self.update(&watch, &name).await;
                }
            }
            70..=84 => {
                if let Some(name) = pick(self) {
                    self.delete(&watch, &name).await;
                }
            }
            _ => {
                if let Some(name) = pick(self) {
                    self.delete(&watch, &name).await;
                    self.create(&watch, Some(name)).await;
                }
            }
        }
    }

    fn api(&self, watch: &WatchKey) -> Api<DynamicObject> {
        api(&self.client, watch)
    }

    fn selects(&self, watch: &WatchKey) -> bool {
        watch.resource == "configmaps" && watch.namespace == self.layout.selected
    }

    async fn create(&mut self, watch: &WatchKey, name: Option<String>) {
        let name = name.unwrap_or_else(|| {
            self.next_name += 1;
            format!("o{}", self.next_name)
        });
        let selected = self.selects(watch) && self.rng.random_bool(0.6);
        let large = watch.resource == "configmaps" && self.rng.random_range(0..60) == 0;
        let value = if large {
            "x".repeat(LARGE_BYTES)
        } else {
            self.rng.random::<u32>().to_string()
        };
        let (api_version, kind, field) = if watch.resource == CRD_PLURAL {
            (format!("{CRD_GROUP}/v1"), "Gadget", "spec")
        } else {
            ("v1".to_string(), "ConfigMap", "data")
        };
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": api_version,
            "kind": kind,
            "metadata": {"name": name, "labels": {SELECT_LABEL: if selected { "in" } else { "out" }}},
            field: {"v": value},
        }))
        .expect("object manifest");
        self.mark_sent();
        let answer = self
            .api(watch)
            .create(&PostParams::default(), &object)
            .await;
        if let Some(o) = self.answered(watch, &name, "create", answer).await {
            let uid = o.metadata.uid.clone().unwrap_or_default();
            let visible = !self.selects(watch) || selected;
            self.record(watch, &name, &uid, &o, Op::Create, false, visible);
            let live = Live { uid, selected };
            self.objects
                .entry(watch.clone())
                .or_default()
                .insert(name, live);
        }
    }

    async fn update(&mut self, watch: &WatchKey, name: &str) {
        let Some(live) = self.objects.get(watch).and_then(|o| o.get(name)).cloned() else {
            return;
        };
        let relabel = self.selects(watch) && self.rng.random_bool(0.4);
        let selected = live.selected != relabel;
        let field = if watch.resource == CRD_PLURAL {
            "spec"
        } else {
            "data"
        };
        let patch = json!({
            "metadata": {"labels": {SELECT_LABEL: if selected { "in" } else { "out" }}},
            field: {"v": self.rng.random::<u32>().to_string()},
        });
        self.mark_sent();
        let answer = self
            .api(watch)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
        if let Some(o) = self.answered(watch, name, "update", answer).await {
            let select = self.selects(watch);
            let was = !select || live.selected;
            let now = !select || selected;
            self.record(watch, name, &live.uid, &o, Op::Update, was, now);
            if let Some(l) = self.objects.get_mut(watch).and_then(|m| m.get_mut(name)) {
                l.selected = selected;
            }
        }
    }

    async fn delete(&mut self, watch: &WatchKey, name: &str) {
        let Some(live) = self.objects.get(watch).and_then(|o| o.get(name)).cloned() else {
            return;
        };
        self.mark_sent();
        let answer = self.api(watch).delete(name, &DeleteParams::default()).await;
        // The API server answers a delete with the object (its resourceVersion then is the
        // deletion's) or, for most built-in kinds, with a Status: the deletion's
        // resourceVersion is then unknown (0).
        let answer = answer.map(|e| {
            e.left().unwrap_or_else(|| {
                let mut gone = DynamicObject::new(name, &ApiResource::erase::<ConfigMap>(&()));
                gone.metadata.resource_version = Some("0".into());
                gone
            })
        });
        if let Some(o) = self.answered(watch, name, "delete", answer).await {
            let was = !self.selects(watch) || live.selected;
            self.record(watch, name, &live.uid, &o, Op::Delete, was, false);
            if let Some(m) = self.objects.get_mut(watch) {
                m.remove(name);
            }
        }
    }

    /// Deletes a namespace with everything in it, as the namespace controller would: the
    /// namespace first (it turns Terminating), then its objects, then its finalizer.
    async fn delete_namespace(&mut self, ns: &str) {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        if let Err(e) = namespaces.delete(ns, &DeleteParams::default()).await {
            self.failed("namespace delete", Some(&e));
            return;
        }
        self.deleted_namespaces.insert(ns.to_string());
        let watches: Vec<WatchKey> = self
            .objects
            .keys()
            .filter(|w| w.namespace == ns)
            .cloned()
            .collect();
        for watch in watches {
            let names: Vec<String> = self.objects[&watch].keys().cloned().collect();
            for name in names {
                self.delete(&watch, &name).await;
            }
        }
        let finalize = json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ns}, "spec": {"finalizers": []},
        });
        let body = serde_json::to_vec(&finalize).expect("namespace json");
        let request = hyper::Request::put(format!("/api/v1/namespaces/{ns}/finalize"))
            .header("content-type", "application/json")
            .body(body)
            .expect("finalize request");
        if let Err(e) = self.client.request_text(request).await {
            self.failed("namespace finalize", Some(&e));
        }
    }

    /// The object the API server answered, or `None` after recording the failure (and, when
    /// the outcome is unknown, marking the object uncertain and reading it back).
    async fn answered(
        &mut self,
        watch: &WatchKey,
        name: &str,
        verb: &str,
        answer: Result<DynamicObject, kube::Error>,
    ) -> Option<DynamicObject> {
        let e = match answer {
            Ok(o) => return Some(o),
            Err(e) => e,
        };
        let refused = matches!(&e, kube::Error::Api(s) if s.code >= 400 && s.code < 500);
        self.failed(verb, Some(&e));
        if !refused {
            self.ledger
                .lock()
                .unwrap()
                .uncertain
                .insert((watch.clone(), name.to_string()));
        }
        self.resync(watch, name).await;
        None
    }

    /// Reads one object back after a failed write, so the model follows the cluster.
    async fn resync(&mut self, watch: &WatchKey, name: &str) {
        for _ in 0..50 {
            match self.api(watch).get_opt(name).await {
                Ok(Some(o)) => {
                    let selected = o
                        .metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(SELECT_LABEL))
                        .is_some_and(|v| v == "in");
                    let uid = o.metadata.uid.clone().unwrap_or_default();
                    let live = Live { uid, selected };
                    self.objects
                        .entry(watch.clone())
                        .or_default()
                        .insert(name.to_string(), live);
                    return;
                }
                Ok(None) => {
                    if let Some(m) = self.objects.get_mut(watch) {
                        m.remove(name);
                    }
                    return;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    fn failed(&self, what: &str, error: Option<&kube::Error>) {
        let reason = match error {
            Some(kube::Error::Api(s)) => format!("{what}: {} {}", s.code, s.reason),
            Some(_) => format!("{what}: no answer"),
            None => what.to_string(),
        };
        *self
            .ledger
            .lock()
            .unwrap()
            .failures
            .entry(reason)
            .or_default() += 1;
    }

    /// A write is about to be sent: its time is the one recorded (its event may arrive before
    /// the API server's answer does).
    fn mark_sent(&mut self) {
        self.sent_ms = self.started.elapsed().as_millis() as u64;
    }

    #[allow(clippy::too_many_arguments)]
    fn record(
        &self,
        watch: &WatchKey,
        name: &str,
        uid: &str,
        answer: &DynamicObject,
        op: Op,
        was_visible: bool,
        visible: bool,
    ) {
        let rv = answer
            .metadata
            .resource_version
            .as_deref()
            .and_then(|r| r.parse().ok())
            .expect("a numeric resourceVersion in the API server's answer");
        self.ledger.lock().unwrap().writes.push(Write {
            at_ms: self.sent_ms,
            watch: watch.clone(),
            name: name.to_string(),
            uid: uid.to_string(),
            rv,
            op,
            was_visible,
            visible,
        });
    }
}
