//! The `/metrics` document, encoded by the official `prometheus-client` crate.
//!
//! The watches and pipelines count in plain atomics of their [`Status`] (the hot path takes no
//! lock and knows nothing of Prometheus); a [`Collector`] reads them at scrape time and encodes
//! them as constant counters, gauges and histograms. The exposition is OpenMetrics text
//! ([`CONTENT_TYPE`]), which Prometheus scrapes natively: a counter family's `# TYPE` line names
//! it without `_total` and its samples end in `_total`, names ending in `_seconds` declare their
//! unit in a `# UNIT` line, and the document ends with `# EOF`. Sample names and labels are those
//! of docs/metrics.md.

use std::fmt;
use std::sync::Weak;
use std::sync::atomic::Ordering;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet, text,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};

use super::{NAMESPACE, Role, State};
use crate::budget::Budget;
use crate::status::{Histogram, LATENCY_BUCKETS, STALL_REASONS, Status};
use crate::supervisor::WatchHandle;

/// The content type of the `/metrics` document.
pub(super) const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Closed set of `change` label values, in the order of [`Status::observed`].
const CHANGES: [&str; 3] = ["added", "modified", "deleted"];

/// Closed set of `reason` label values of `publish_failures_total`.
const PUBLISH_FAILURES: [&str; 8] = [
    "retried",
    "encode",
    "too_large",
    "invalid",
    "not_authorized",
    "not_found",
    "unknown_topic",
    "invalid_topic",
];

/// Closed set of `reason` label values of `relists_total`.
const RELISTS: [&str; 2] = ["initial", "gone"];

/// The unit of every metric whose name ends in `_seconds`.
static SECONDS: Unit = Unit::Seconds;
static BYTES: Unit = Unit::Bytes;

/// A registry holding the collector of `state`'s metrics, all named `kube_event_bridge_*`.
pub(super) fn registry(state: Weak<State>) -> Registry {
    let mut registry = Registry::with_prefix(NAMESPACE);
    registry.register_collector(Box::new(Exposition { state }));
    registry
}

/// The OpenMetrics text of `registries`, one document.
pub(super) fn encode(registries: &[&Registry]) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail, and the collectors fail only when their writer does.
    for registry in registries {
        let _ = text::encode_registry(&mut out, registry);
    }
    let _ = text::encode_eof(&mut out);
    out
}

/// Reads the admin state at scrape time.
#[derive(Debug)]
struct Exposition {
    /// The state that owns the registry holding this collector.
    state: Weak<State>,
}

impl Collector for Exposition {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let Some(state) = self.state.upgrade() else {
            return Ok(());
        };
        let watches = state.watches();
        process(&mut encoder, &state)?;
        let mut families = Families {
            encoder: &mut encoder,
            watches: &watches,
        };
        events(&mut families)?;
        publishing(&mut families)?;
        watching(&mut families)?;
        checkpoints(&mut families)?;
        snapshots(families.encoder, &state.snapshots)?;
        if let Some(fleet) = state.fleet_metrics() {
            fleet_families(families.encoder, &fleet)?;
        }
        match state.shard() {
            Some(shard) => sharding(&mut families, &shard),
            None => Ok(()),
        }
    }
}

/// The process's families: build, readiness, leadership and API requests.
fn process(encoder: &mut DescriptorEncoder, state: &State) -> fmt::Result {
    let build =
        encoder.encode_descriptor("build_info", "Build information.", None, MetricType::Gauge)?;
    labelled(
        build,
        &[("version", env!("CARGO_PKG_VERSION")), ("sink", state.sink)],
        ConstGauge::new(1),
    )?;
    single(
        encoder,
        "ready",
        "1 when every watch has synced and shutdown has not started.",
        None,
        ConstGauge::new(i64::from(state.ready())),
    )?;
    let publishing = encoder.encode_descriptor(
        "cluster_publishing",
        "Per cluster: 1 when it publishes (reachable, every watch synced, none stalled).",
        None,
        MetricType::Gauge,
    )?;
    for_clusters(publishing, &state.clusters_publishing())?;
    single(
        encoder,
        "leader",
        "1 when this replica publishes (leader, or no leader election).",
        None,
        ConstGauge::new(i64::from(state.role() != Role::Follower)),
    )?;
    let api = &state.api;
    single(
        encoder,
        "api_requests",
        "Requests started against the Kubernetes API server (a watch counts once).",
        None,
        ConstCounter::new(api.started()),
    )?;
    single(
        encoder,
        "api_requests_throttled",
        "API server requests delayed by kubernetes.qps and kubernetes.burst.",
        None,
        ConstCounter::new(api.throttled()),
    )?;
    single(
        encoder,
        "api_throttle_wait",
        "Time API server requests were held back waiting for kubernetes.qps.",
        Some(&SECONDS),
        ConstCounter::new(api.waited().as_secs_f64()),
    )?;
    single(
        encoder,
        "kafka_transactional_producers",
        "Transactional Kafka producers alive: one shared by the watches, or one per watch with sharding.",
        None,
        ConstGauge::new(
            i64::try_from(crate::sink::kafka::PRODUCERS.load(Ordering::Relaxed))
                .unwrap_or(i64::MAX),
        ),
    )?;
    if let Some(budget) = state.queue_budget() {
        queue_budget(encoder, &budget)?;
    }
    allocator(encoder)
}

/// The process's byte budget (`delivery.maxTotalQueueBytes`): how much of it the watches hold,
/// and how long they waited for room in it, held back by each other's bytes.
fn queue_budget(encoder: &mut DescriptorEncoder, budget: &Budget) -> fmt::Result {
    let gauge = |n: usize| ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX));
    single(
        encoder,
        "queue_total_reserved",
        "Bytes of objects every watch together holds between the API server and the broker's acknowledgement.",
        Some(&BYTES),
        gauge(budget.reserved_bytes()),
    )?;
    single(
        encoder,
        "queue_total_limit",
        "delivery.maxTotalQueueBytes: the bytes every watch together may hold.",
        Some(&BYTES),
        gauge(budget.max_bytes()),
    )?;
    single(
        encoder,
        "queue_total_waiting",
        "Watches waiting for room in delivery.maxTotalQueueBytes now.",
        None,
        gauge(budget.waiting()),
    )?;
    single(
        encoder,
        "queue_total_wait",
        "Time watches waited for room in delivery.maxTotalQueueBytes, all together.",
        Some(&SECONDS),
        ConstCounter::new(budget.waited_secs()),
    )
}

/// The heap as jemalloc counts it (docs/architecture.md, "Memory"; the figures are in
/// docs/benchmarks.md): what the program holds (`allocated`), the pages that serve it
/// (`active`), the allocator's own `metadata`, what is in memory (`resident`) and what stays
/// mapped though given back to the system (`retained`).
fn allocator(encoder: &mut DescriptorEncoder) -> fmt::Result {
    use tikv_jemalloc_ctl::{epoch, stats};
    // The figures are a snapshot refreshed by advancing the epoch; a figure jemalloc cannot give
    // is left out rather than reported as 0.
    if epoch::advance().is_err() {
        return Ok(());
    }
    let mut family = encoder.encode_descriptor(
        "allocator",
        "Heap bytes as the allocator (jemalloc) counts them, by state.",
        Some(&BYTES),
        MetricType::Gauge,
    )?;
    type Read = fn() -> Result<usize, tikv_jemalloc_ctl::Error>;
    let states: [(&str, Read); 5] = [
        ("allocated", stats::allocated::read),
        ("active", stats::active::read),
        ("metadata", stats::metadata::read),
        ("resident", stats::resident::read),
        ("retained", stats::retained::read),
    ];
    for (state, read) in states {
        if let Ok(bytes) = read() {
            let gauge = ConstGauge::new(i64::try_from(bytes).unwrap_or(i64::MAX));
            gauge.encode(family.encode_family(&[("state", state)])?)?;
        }
    }
    Ok(())
}

/// What happened to the changes each watch saw.
fn events(f: &mut Families) -> fmt::Result {
    f.per_label(
        "events_observed",
        "Changes classified for publishing, by resource and change.",
        MetricType::Counter,
        ("change", &CHANGES),
        |s, i, _| ConstCounter::new(s.observed[i].load(Ordering::Relaxed)),
    )?;
    f.per_label(
        "events_published",
        "Events acknowledged by the broker, by resource and change.",
        MetricType::Counter,
        ("change", &CHANGES),
        |s, i, _| ConstCounter::new(s.published[i].load(Ordering::Relaxed)),
    )?;
    f.per_watch_counter(
        "events_filtered",
        "Changes dropped by the configured event-type filter.",
        |s| s.filtered.load(Ordering::Relaxed),
    )?;
    f.per_watch_counter(
        "events_suppressed",
        "Updates not published because only noise changed (resourceVersion, generation, managedFields, ignorePaths).",
        |s| s.suppressed.load(Ordering::Relaxed),
    )?;
    f.per_watch_counter(
        "events_truncated",
        "Events published as a reference because the whole event exceeded the broker's message size.",
        |s| s.truncated.load(Ordering::Relaxed),
    )?;
    f.per_watch_counter(
        "events_repaired",
        "Events found by a relist after lost watch history.",
        |s| s.repaired.load(Ordering::Relaxed),
    )?;
    f.per_watch_counter(
        "trace_context_invalid",
        "Trace context annotations ignored as invalid: the event started a new trace (an invalid traceparent) or went without the tracestate.",
        |s| s.trace_context_invalid.load(Ordering::Relaxed),
    )
}

/// How publishing goes: failures, stalls, aborted transactions, latency and queue depth.
fn publishing(f: &mut Families) -> fmt::Result {
    f.per_label(
        "publish_failures",
        "Publish failures: retried (sent again), refused for good and skipped (too_large, invalid, encode), or refused for every event and retried after a pause (not_authorized, not_found, unknown_topic, invalid_topic).",
        MetricType::Counter,
        ("reason", &PUBLISH_FAILURES),
        |s, _, reason| {
            ConstCounter::new(match reason {
                "retried" => s.retried.load(Ordering::Relaxed),
                "encode" => s.encode_failed.load(Ordering::Relaxed),
                "not_authorized" | "not_found" | "unknown_topic" | "invalid_topic" => {
                    by_reason(&s.blocked, reason)
                }
                other => by_reason(&s.rejected, other),
            })
        },
    )?;
    f.per_label(
        "watch_stalled",
        "1 while a watch cannot publish, by reason: the broker refuses every event (not_authorized, not_found, unknown_topic, invalid_topic) or publishing has failed for 30 s (publish_failing, broker_unavailable). It retries and resumes by itself.",
        MetricType::Gauge,
        ("reason", &STALL_REASONS),
        |s, _, reason| ConstGauge::new(i64::from(s.stall().is_some_and(|st| st.reason == reason))),
    )?;
    f.per_watch_counter(
        "transactions_aborted",
        "Kafka transactions aborted after a failed delivery or commit; their events were sent again.",
        |s| s.aborted_transactions.load(Ordering::Relaxed),
    )?;
    f.per_watch(
        "publish_latency",
        "Time from a change being received to the broker's acknowledgement.",
        Some(&SECONDS),
        MetricType::Histogram,
        |s| Latency::of(&s.latency),
    )?;
    f.per_watch(
        "send_latency",
        "Time from a change being received to its event being handed to the broker client: the bridge's own part of publish_latency (queueing while the in-flight window is full or a Kafka commit is due or in progress, classification, encoding, waiting for an earlier event of the same object to be acknowledged).",
        Some(&SECONDS),
        MetricType::Histogram,
        |s| Latency::of(&s.send_latency),
    )?;
    // Only watches that commit transactions observe it.
    f.per_watch_where(
        "visible_latency",
        "Kafka transactions: time from a change being received to the commit of the transaction holding its event, when read_committed consumers see it.",
        Some(&SECONDS),
        MetricType::Histogram,
        |s| (s.visible_latency.count.load(Ordering::Relaxed) > 0).then(|| Latency::of(&s.visible_latency)),
    )?;
    f.per_watch(
        "queue_depth_events",
        "Events queued or awaiting acknowledgement.",
        None,
        MetricType::Gauge,
        |s| ConstGauge::new(s.queue_depth.load(Ordering::Relaxed)),
    )
}

/// The watches' restarts and lists.
fn watching(f: &mut Families) -> fmt::Result {
    f.per_label(
        "watch_restarts",
        "Watch restarts by reason.",
        MetricType::Counter,
        ("reason", &crate::watch::RESTART_REASONS),
        |s, _, reason| ConstCounter::new(by_reason(&s.restarts, reason)),
    )?;
    f.per_label(
        "relists",
        "LISTs by reason: initial (no checkpoint) or gone (410).",
        MetricType::Counter,
        ("reason", &RELISTS),
        |s, _, reason| ConstCounter::new(by_reason(&s.relists, reason)),
    )?;
    f.per_label(
        "lists_completed",
        "Lists completed, by method: stream (a streaming list) or list (a paged LIST).",
        MetricType::Counter,
        ("method", &crate::watch::LIST_METHODS),
        |s, _, method| ConstCounter::new(by_reason(&s.lists, method)),
    )?;
    f.per_label(
        "watch_requests_spared",
        "Requests to the API server spared because another watch of the resource had found out, by reason: gone (a watch from a resourceVersion found gone, not made or withdrawn before it was sent) or probe (a probe covered by another's fresh answer).",
        MetricType::Counter,
        ("reason", &crate::watch::SPARED_REASONS),
        |s, _, reason| ConstCounter::new(by_reason(&s.spared, reason)),
    )?;
    f.per_watch_counter(
        "initial_list_fallbacks",
        "Streaming lists the API server refused, listed in pages instead (kubernetes.initialList: auto).",
        |s| s.list_fallbacks.load(Ordering::Relaxed),
    )
}

/// Checkpoints saved, found corrupt, their age and how far the watch is ahead of them.
fn checkpoints(f: &mut Families) -> fmt::Result {
    f.per_watch_counter("checkpoints", "Checkpoints saved.", |s| {
        s.checkpoints.load(Ordering::Relaxed)
    })?;
    f.per_watch_counter(
        "checkpoints_corrupt",
        "Stored checkpoints that could not be decoded; the watch listed again to repair.",
        |s| s.checkpoints_corrupt.load(Ordering::Relaxed),
    )?;
    f.per_watch(
        "checkpoint_age",
        "Time since the last checkpoint was saved (-1 before the first).",
        Some(&SECONDS),
        MetricType::Gauge,
        |s| {
            ConstGauge::new(
                s.checkpoint()
                    .map_or(-1.0, |(_, at)| at.elapsed().as_secs_f64()),
            )
        },
    )?;
    f.per_watch(
        "checkpoint_lag_resource_versions",
        "Watch position minus checkpointed resourceVersion (numeric resourceVersions).",
        None,
        MetricType::Gauge,
        |s| {
            let position = s.position.load(Ordering::Relaxed);
            let saved: u64 = s
                .checkpoint_resource_version()
                .and_then(|r| r.parse().ok())
                .unwrap_or(position);
            ConstGauge::new(position.saturating_sub(saved))
        },
    )
}

/// In a fleet: the members and the refused kubeconfig Secrets by reason.
fn fleet_families(encoder: &mut DescriptorEncoder, fleet: &crate::fleet::Metrics) -> fmt::Result {
    single(
        encoder,
        "cluster_members",
        "Clusters of the fleet this process runs (publishing or retrying).",
        None,
        ConstGauge::new(fleet.members.load(Ordering::Relaxed) as i64),
    )?;
    let mut family = encoder.encode_descriptor(
        "cluster_secrets_refused",
        "Kubeconfig Secrets refused (not in Cluster API's format), by reason.",
        None,
        MetricType::Counter,
    )?;
    for (reason, n) in crate::fleet::secret::Refusal::ALL
        .iter()
        .zip(&fleet.refused)
    {
        ConstCounter::new(n.load(Ordering::Relaxed))
            .encode(family.encode_family(&[("reason", reason.label())])?)?;
    }
    Ok(())
}

/// Snapshots on demand: ended by result, objects by outcome, walks going on.
fn snapshots(encoder: &mut DescriptorEncoder, c: &crate::admin::SnapshotCounters) -> fmt::Result {
    let mut family = encoder.encode_descriptor(
        "snapshots",
        "Snapshots on demand this replica ended, by result: complete or failed.",
        None,
        MetricType::Counter,
    )?;
    for (result, n) in crate::admin::SNAPSHOT_RESULTS.iter().zip(&c.ended) {
        ConstCounter::new(n.load(Ordering::Relaxed))
            .encode(family.encode_family(&[("result", *result)])?)?;
    }
    let mut family = encoder.encode_descriptor(
        "snapshot_objects",
        "Objects read by snapshots on demand, by outcome: emitted (published with origin=snapshot, acknowledged) or skipped (a newer state or the delete was published since); and keys pruned (a tombstone published, acknowledged, for a key the compacted topic held and the cluster no longer has).",
        None,
        MetricType::Counter,
    )?;
    for (outcome, n) in crate::admin::SNAPSHOT_OUTCOMES.iter().zip(&c.objects) {
        ConstCounter::new(n.load(Ordering::Relaxed))
            .encode(family.encode_family(&[("outcome", *outcome)])?)?;
    }
    single(
        encoder,
        "snapshots_running",
        "Snapshots on demand being walked on this replica.",
        None,
        ConstGauge::new(c.running.load(Ordering::Relaxed) as i64),
    )
}

/// With sharding: the watches held, hand-offs by reason, and how long watches had no owner
/// before this replica took them (a histogram, and the last value per watch).
fn sharding(f: &mut Families, shard: &crate::shard::Metrics) -> fmt::Result {
    single(
        f.encoder,
        "shard_watches_owned",
        "Watches whose Lease this replica holds.",
        None,
        ConstGauge::new(shard.owned.load(Ordering::Relaxed) as i64),
    )?;
    let mut family = f.encoder.encode_descriptor(
        "shard_handoffs",
        "Watches this replica stopped owning, by reason: rebalance (given to a replica that joined or stayed), unselected (no longer desired), shutdown, lost (Lease lapsed or taken over, or fenced).",
        None,
        MetricType::Counter,
    )?;
    for (reason, n) in crate::shard::REASONS.iter().zip(&shard.handoffs) {
        ConstCounter::new(n.load(Ordering::Relaxed))
            .encode(family.encode_family(&[("reason", *reason)])?)?;
    }
    single(
        f.encoder,
        "shard_unowned",
        "Time a watch had no owner before this replica took it over (released: from the release; expired: from the previous owner's last renewal).",
        Some(&SECONDS),
        Unowned::of(shard),
    )?;
    f.per_watch(
        "shard_watch_unowned_before",
        "Time this watch had no owner before this replica took it over (0: it never had one).",
        Some(&SECONDS),
        MetricType::Gauge,
        |s| ConstGauge::new(s.unowned_before_ms.load(Ordering::Relaxed) as f64 / 1e3),
    )
}

/// Sharding's time-without-owner histogram, from cumulative bucket counts.
struct Unowned(Latency);

impl Unowned {
    fn of(shard: &crate::shard::Metrics) -> Self {
        let count = shard.unowned_count.load(Ordering::Relaxed);
        Self(Latency {
            sum: shard.unowned_sum_micros.load(Ordering::Relaxed) as f64 / 1e6,
            count,
            buckets: own_buckets(
                &crate::shard::UNOWNED_BUCKETS,
                &shard.unowned_buckets,
                count,
            ),
        })
    }
}

impl EncodeMetric for Unowned {
    fn encode(&self, encoder: MetricEncoder) -> fmt::Result {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// One sample per cluster, labelled `cluster`: 1 when it publishes.
fn for_clusters(mut family: MetricEncoder, clusters: &[(String, bool)]) -> fmt::Result {
    for (name, publishing) in clusters {
        ConstGauge::new(i64::from(*publishing))
            .encode(family.encode_family(&[("cluster", name.as_str())])?)?;
    }
    Ok(())
}

/// One family with one sample without labels.
pub(super) fn single(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    metric: impl EncodeMetric,
) -> fmt::Result {
    metric.encode(encoder.encode_descriptor(name, help, unit, metric.metric_type())?)
}

/// One sample of `family`, with `labels`.
fn labelled(
    mut family: MetricEncoder,
    labels: &[(&str, &str)],
    metric: impl EncodeMetric,
) -> fmt::Result {
    metric.encode(family.encode_family(&labels)?)
}

/// A closed-set counter's value.
fn by_reason(
    map: &std::sync::Mutex<std::collections::BTreeMap<&'static str, u64>>,
    reason: &str,
) -> u64 {
    map.lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(reason)
        .copied()
        .unwrap_or(0)
}

/// Encodes families with one sample per watch, labelled `cluster`, `resource` and `namespace`
/// (`*` for a watch of every namespace or of a cluster-scoped resource).
struct Families<'a, 'e> {
    encoder: &'a mut DescriptorEncoder<'e>,
    watches: &'a [WatchHandle],
}

impl Families<'_, '_> {
    /// One sample per watch, of the metric `value` makes from its status.
    fn per_watch<M: EncodeMetric>(
        &mut self,
        name: &str,
        help: &str,
        unit: Option<&Unit>,
        metric_type: MetricType,
        value: impl Fn(&Status) -> M,
    ) -> fmt::Result {
        self.per_watch_where(name, help, unit, metric_type, |s| Some(value(s)))
    }

    /// One sample per watch for which `value` gives one.
    fn per_watch_where<M: EncodeMetric>(
        &mut self,
        name: &str,
        help: &str,
        unit: Option<&Unit>,
        metric_type: MetricType,
        value: impl Fn(&Status) -> Option<M>,
    ) -> fmt::Result {
        let mut family = self
            .encoder
            .encode_descriptor(name, help, unit, metric_type)?;
        for w in self.watches {
            let Some(metric) = value(&w.status) else {
                continue;
            };
            let labels = [
                ("cluster", &*w.cluster),
                ("resource", w.resource.as_str()),
                ("namespace", namespace(w)),
            ];
            metric.encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }

    /// A counter (`<name>_total`) with one sample per watch.
    fn per_watch_counter(
        &mut self,
        name: &str,
        help: &str,
        value: impl Fn(&Status) -> u64,
    ) -> fmt::Result {
        self.per_watch(name, help, None, MetricType::Counter, |s| {
            ConstCounter::new(value(s))
        })
    }

    /// One sample per watch and value of a closed-set label: `value` gets the status, the
    /// index of the label value and the label value.
    fn per_label<M: EncodeMetric>(
        &mut self,
        name: &str,
        help: &str,
        metric_type: MetricType,
        (label, values): (&str, &[&str]),
        value: impl Fn(&Status, usize, &str) -> M,
    ) -> fmt::Result {
        let mut family = self
            .encoder
            .encode_descriptor(name, help, None, metric_type)?;
        for w in self.watches {
            for (i, v) in values.iter().enumerate() {
                let labels = [
                    ("cluster", &*w.cluster),
                    ("resource", w.resource.as_str()),
                    ("namespace", namespace(w)),
                    (label, *v),
                ];
                value(&w.status, i, v).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// The `namespace` label of a watch.
fn namespace(w: &WatchHandle) -> &str {
    w.namespace.as_deref().unwrap_or("*")
}

/// One of a watch's latency histograms, read from its cumulative bucket counts.
struct Latency {
    sum: f64,
    count: u64,
    /// Upper bound and the count of observations in that bucket alone (the crate accumulates).
    buckets: Vec<(f64, u64)>,
}

impl Latency {
    fn of(histogram: &Histogram) -> Self {
        let count = histogram.count.load(Ordering::Relaxed);
        Self {
            sum: histogram.sum_micros.load(Ordering::Relaxed) as f64 / 1e6,
            count,
            buckets: own_buckets(&LATENCY_BUCKETS, &histogram.buckets, count),
        }
    }
}

/// Each bucket's own count (the crate accumulates) from cumulative counts per upper bound, with
/// the `+Inf` bucket. The atomics are read one by one while they may grow: a bucket never goes
/// below the one before.
fn own_buckets(
    bounds: &[f64],
    cumulative: &[std::sync::atomic::AtomicU64],
    count: u64,
) -> Vec<(f64, u64)> {
    let mut below = 0;
    let mut buckets: Vec<(f64, u64)> = bounds
        .iter()
        .zip(cumulative)
        .map(|(bound, cumulative)| {
            let cumulative = cumulative.load(Ordering::Relaxed);
            let own = cumulative.saturating_sub(below);
            below = below.max(cumulative);
            (*bound, own)
        })
        .collect();
    buckets.push((f64::INFINITY, count.saturating_sub(below)));
    buckets
}

impl EncodeMetric for Latency {
    fn encode(&self, mut encoder: MetricEncoder) -> fmt::Result {
        encoder.encode_histogram::<NoLabelSet>(self.sum, self.count, &self.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;
    use std::sync::atomic::Ordering::Relaxed;

    use super::*;
    use crate::status::count;

    /// A watch of deployments in `prod` with known counts, and an idle watch of configmaps.
    fn watches() -> Vec<WatchHandle> {
        let busy = Arc::new(Status::default());
        for (i, n) in [3, 5, 7].into_iter().enumerate() {
            busy.observed[i].store(n, Relaxed);
            busy.published[i].store(n - 1, Relaxed);
        }
        busy.filtered.store(11, Relaxed);
        busy.suppressed.store(12, Relaxed);
        busy.truncated.store(13, Relaxed);
        busy.encode_failed.store(14, Relaxed);
        busy.retried.store(15, Relaxed);
        busy.repaired.store(16, Relaxed);
        busy.trace_context_invalid.store(21, Relaxed);
        count(&busy.rejected, "too_large");
        count(&busy.rejected, "invalid");
        count(&busy.rejected, "invalid");
        count(&busy.blocked, "unknown_topic");
        count(&busy.restarts, "gone");
        count(&busy.relists, "initial");
        count(&busy.relists, "gone");
        count(&busy.lists, "stream");
        count(&busy.spared, "probe");
        busy.list_fallbacks.store(22, Relaxed);
        busy.checkpoints.store(17, Relaxed);
        busy.checkpoints_corrupt.store(18, Relaxed);
        busy.queue_depth.store(19, Relaxed);
        busy.aborted_transactions.store(20, Relaxed);
        busy.position.store(120, Relaxed);
        for seconds in [0.0005, 0.003, 0.2, 0.2, 2.0, 60.0] {
            busy.latency.observe(seconds);
        }
        for seconds in [0.004, 0.04] {
            busy.visible_latency.observe(seconds);
        }
        for seconds in [0.0002, 0.0004, 0.003] {
            busy.send_latency.observe(seconds);
        }
        busy.set_stall("publish_failing", "broker timed out");
        vec![
            WatchHandle {
                cluster: "dev".into(),
                resource: "apps/v1/deployments".into(),
                namespace: Some("prod".into()),
                status: busy,
                demand: None,
            },
            WatchHandle {
                cluster: "dev".into(),
                resource: "v1/configmaps".into(),
                namespace: None,
                status: Arc::new(Status::default()),
                demand: None,
            },
        ]
    }

    /// The document of a Kafka bridge running [`watches`].
    fn document() -> String {
        let state = State::new("kafka");
        state.set_watches("dev", watches());
        let budget = crate::budget::Budget::new(64 << 20);
        let _held = futures::executor::block_on(budget.reserve(3 << 10));
        state.set_queue_budget(budget);
        state.metrics()
    }

    /// Every sample of `document`: name and labels (sorted, `k=v` joined by `,`) to value.
    fn samples(document: &str) -> HashMap<(String, String), f64> {
        let scrape = prometheus_parse::Scrape::parse(document.lines().map(|l| Ok(l.to_string())))
            .expect("the document parses");
        let mut samples = HashMap::new();
        for s in scrape.samples {
            let labels = s.labels.iter().map(|(k, v)| format!("{k}={v}"));
            match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => {
                    samples.insert((s.metric, sorted(labels)), v);
                }
                prometheus_parse::Value::Histogram(buckets) => {
                    for b in buckets {
                        let le = if b.less_than.is_infinite() {
                            "+Inf".to_string()
                        } else {
                            b.less_than.to_string()
                        };
                        let labels = sorted(labels.clone().chain([format!("le={le}")]));
                        samples.insert((format!("{}_bucket", s.metric), labels), b.count);
                    }
                }
                other => panic!("unexpected sample {other:?}"),
            }
        }
        samples
    }

    /// Labels `k=v`, sorted and joined by `,`.
    fn sorted(labels: impl Iterator<Item = impl AsRef<str>>) -> String {
        let mut labels: Vec<String> = labels.map(|l| l.as_ref().to_string()).collect();
        labels.sort();
        labels.join(",")
    }

    const PROD: &str = "cluster=dev,namespace=prod,resource=apps/v1/deployments";
    const ALL: &str = "cluster=dev,namespace=*,resource=v1/configmaps";

    #[test]
    fn every_documented_sample_has_its_labels_and_value() {
        // The API counters are the process's: other tests move them meanwhile.
        let api = crate::throttle::Counters::process();
        let before = (api.started(), api.throttled(), api.waited());
        let samples = samples(&document());
        let after = (api.started(), api.throttled(), api.waited());
        let value = |name: &str, labels: &str| {
            let key = (
                format!("kube_event_bridge_{name}"),
                sorted(labels.split(',').filter(|l| !l.is_empty())),
            );
            *samples
                .get(&key)
                .unwrap_or_else(|| panic!("no sample {name}{{{labels}}} in {samples:#?}"))
        };
        let version = env!("CARGO_PKG_VERSION");
        assert_eq!(
            value("build_info", &format!("sink=kafka,version={version}")),
            1.0
        );
        assert_eq!(value("ready", ""), 0.0, "a watch is stalled");
        assert_eq!(value("leader", ""), 1.0);
        let requests = value("api_requests_total", "");
        assert!((before.0 as f64..=after.0 as f64).contains(&requests));
        let throttled = value("api_requests_throttled_total", "");
        assert!((before.1 as f64..=after.1 as f64).contains(&throttled));
        let heap = |state: &str| value("allocator_bytes", &format!("state={state}"));
        assert!(heap("allocated") > 0.0);
        assert!(
            heap("active") >= heap("allocated"),
            "pages hold what is allocated"
        );
        assert_eq!(value("queue_total_reserved_bytes", ""), 3072.0);
        assert_eq!(value("queue_total_limit_bytes", ""), 67108864.0);
        assert_eq!(value("queue_total_wait_seconds_total", ""), 0.0);
        assert_eq!(value("queue_total_waiting", ""), 0.0);
        let waited = value("api_throttle_wait_seconds_total", "");
        let (from, to) = (before.2.as_secs_f64(), after.2.as_secs_f64());
        assert!(from - 1e-9 <= waited && waited <= to + 1e-9, "{waited}");
        for (i, change) in CHANGES.iter().enumerate() {
            let labels = format!("change={change},{PROD}");
            let observed = [3.0, 5.0, 7.0][i];
            assert_eq!(value("events_observed_total", &labels), observed);
            assert_eq!(value("events_published_total", &labels), observed - 1.0);
            let idle = format!("change={change},{ALL}");
            assert_eq!(value("events_observed_total", &idle), 0.0);
            assert_eq!(value("events_published_total", &idle), 0.0);
        }
        for (name, busy) in [
            ("events_filtered_total", 11.0),
            ("events_suppressed_total", 12.0),
            ("events_truncated_total", 13.0),
            ("events_repaired_total", 16.0),
            ("trace_context_invalid_total", 21.0),
            ("initial_list_fallbacks_total", 22.0),
            ("transactions_aborted_total", 20.0),
            ("queue_depth_events", 19.0),
            ("checkpoints_total", 17.0),
            ("checkpoints_corrupt_total", 18.0),
            ("checkpoint_age_seconds", -1.0),
            // No checkpoint yet: no lag to report.
            ("checkpoint_lag_resource_versions", 0.0),
        ] {
            assert_eq!(value(name, PROD), busy, "{name}");
            let idle = if name == "checkpoint_age_seconds" {
                -1.0
            } else {
                0.0
            };
            assert_eq!(value(name, ALL), idle, "{name}");
        }
        for (reason, n) in [
            ("retried", 15.0),
            ("encode", 14.0),
            ("too_large", 1.0),
            ("invalid", 2.0),
            ("not_authorized", 0.0),
            ("unknown_topic", 1.0),
            ("invalid_topic", 0.0),
        ] {
            let labels = format!("{PROD},reason={reason}");
            assert_eq!(value("publish_failures_total", &labels), n, "{reason}");
        }
        for reason in STALL_REASONS {
            let stalled = f64::from(u8::from(reason == "publish_failing"));
            let labels = format!("{PROD},reason={reason}");
            assert_eq!(value("watch_stalled", &labels), stalled, "{reason}");
        }
        for reason in crate::watch::RESTART_REASONS {
            let restarts = f64::from(u8::from(reason == "gone"));
            let labels = format!("{PROD},reason={reason}");
            assert_eq!(value("watch_restarts_total", &labels), restarts, "{reason}");
        }
        for reason in RELISTS {
            assert_eq!(
                value("relists_total", &format!("{PROD},reason={reason}")),
                1.0
            );
            assert_eq!(
                value("relists_total", &format!("{ALL},reason={reason}")),
                0.0
            );
        }
        for reason in crate::watch::SPARED_REASONS {
            let labels = format!("{PROD},reason={reason}");
            let spared = f64::from(u8::from(reason == "probe"));
            assert_eq!(
                value("watch_requests_spared_total", &labels),
                spared,
                "{reason}"
            );
        }
        for method in crate::watch::LIST_METHODS {
            let labels = format!("{PROD},method={method}");
            let lists = f64::from(u8::from(method == "stream"));
            assert_eq!(value("lists_completed_total", &labels), lists, "{method}");
        }
        let cumulative = [
            1.0, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 4.0, 4.0, 4.0, 5.0, 5.0,
        ];
        for (bound, n) in LATENCY_BUCKETS.iter().zip(cumulative) {
            let labels = format!("{PROD},le={bound}");
            assert_eq!(
                value("publish_latency_seconds_bucket", &labels),
                n,
                "le={bound}"
            );
        }
        let inf = format!("{PROD},le=+Inf");
        assert_eq!(value("publish_latency_seconds_bucket", &inf), 6.0);
        assert_eq!(value("publish_latency_seconds_count", PROD), 6.0);
        let sum = value("publish_latency_seconds_sum", PROD);
        assert!((sum - 62.4035).abs() < 1e-6, "{sum}");
        assert_eq!(value("publish_latency_seconds_count", ALL), 0.0);
        assert_eq!(value("send_latency_seconds_count", PROD), 3.0);
        let sent = |le: &str| value("send_latency_seconds_bucket", &format!("{PROD},le={le}"));
        assert_eq!((sent("0.001"), sent("0.005")), (2.0, 3.0));
        // Only a watch that committed transactions has a visibility histogram.
        assert_eq!(value("visible_latency_seconds_count", PROD), 2.0);
        let le = |bound: &str| {
            value(
                "visible_latency_seconds_bucket",
                &format!("{PROD},le={bound}"),
            )
        };
        assert_eq!((le("0.0025"), le("0.005"), le("0.05")), (0.0, 1.0, 2.0));
        let idle = (
            "kube_event_bridge_visible_latency_seconds_count".to_string(),
            sorted(ALL.split(',')),
        );
        assert!(!samples.contains_key(&idle), "{samples:#?}");
    }

    #[test]
    fn families_declare_their_type_and_unit_and_the_document_ends_with_eof() {
        let document = document();
        for (family, kind) in [
            ("build_info", "gauge"),
            ("ready", "gauge"),
            ("leader", "gauge"),
            ("api_requests", "counter"),
            ("api_requests_throttled", "counter"),
            ("api_throttle_wait_seconds", "counter"),
            ("kafka_transactional_producers", "gauge"),
            ("allocator_bytes", "gauge"),
            ("events_observed", "counter"),
            ("events_published", "counter"),
            ("events_filtered", "counter"),
            ("events_suppressed", "counter"),
            ("events_truncated", "counter"),
            ("events_repaired", "counter"),
            ("trace_context_invalid", "counter"),
            ("publish_failures", "counter"),
            ("watch_stalled", "gauge"),
            ("transactions_aborted", "counter"),
            ("publish_latency_seconds", "histogram"),
            ("send_latency_seconds", "histogram"),
            ("visible_latency_seconds", "histogram"),
            ("queue_depth_events", "gauge"),
            ("watch_restarts", "counter"),
            ("relists", "counter"),
            ("lists_completed", "counter"),
            ("watch_requests_spared", "counter"),
            ("initial_list_fallbacks", "counter"),
            ("checkpoints", "counter"),
            ("checkpoints_corrupt", "counter"),
            ("checkpoint_age_seconds", "gauge"),
            ("checkpoint_lag_resource_versions", "gauge"),
        ] {
            let line = format!("# TYPE kube_event_bridge_{family} {kind}\n");
            assert_eq!(document.matches(&line).count(), 1, "{line}");
            let unit = format!("# UNIT kube_event_bridge_{family} seconds\n");
            assert_eq!(
                document.contains(&unit),
                family.ends_with("_seconds"),
                "{unit}"
            );
        }
        // Counters' samples, and only theirs, end in `_total`.
        for line in document.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            let family = name.strip_suffix("_total").unwrap_or(name);
            let counter = format!("# TYPE {family} counter\n");
            assert_eq!(
                document.contains(&counter),
                name.ends_with("_total"),
                "{line}"
            );
        }
        assert!(document.ends_with("\n# EOF\n"), "{document}");
    }

    #[test]
    fn a_follower_reports_no_leadership_and_label_values_are_escaped() {
        let state = State::new("nats");
        state.set_role(Role::Follower);
        state.set_watches(
            "dev",
            vec![WatchHandle {
                cluster: "dev".into(),
                resource: "example.com/v1/\"quoted\"".into(),
                namespace: Some("a\\b".into()),
                status: Arc::new(Status::default()),
                demand: None,
            }],
        );
        let document = state.metrics();
        assert!(
            document.contains("\nkube_event_bridge_leader 0\n"),
            "{document}"
        );
        assert!(
            document.contains(
                "\nkube_event_bridge_checkpoints_total{cluster=\"dev\",resource=\"example.com/v1/\\\"quoted\\\"\",namespace=\"a\\\\b\"} 0\n"
            ),
            "{document}"
        );
    }

    #[test]
    fn latency_buckets_never_go_below_the_one_before() {
        // Read while the pipeline adds an observation: a larger bucket not counted yet.
        let histogram = Histogram::default();
        histogram.buckets[0].store(3, Relaxed);
        histogram.buckets[1].store(2, Relaxed);
        for bucket in &histogram.buckets[2..] {
            bucket.store(4, Relaxed);
        }
        histogram.count.store(4, Relaxed);
        let latency = Latency::of(&histogram);
        let own: Vec<u64> = latency.buckets.iter().map(|(_, n)| *n).collect();
        assert_eq!(own, [3, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(latency.buckets.last().unwrap().0, f64::INFINITY);
        assert_eq!(latency.count, 4);
    }
}
