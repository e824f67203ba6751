//! Where a bootstrapping subscription starts: at the begin marker of the latest completed
//! snapshot on demand of each watch whose markers it found, the earliest of them. The
//! subscriptions look back through their topics or stream and hand the markers they found here.

use std::collections::HashMap;

use crate::event::{Marker, MarkerKind, SnapshotResult};

/// A marker found while looking back.
#[derive(Debug, Clone)]
pub(crate) struct Found {
    /// Its place in its watch's order (Kafka: its record timestamp, since each marker is keyed
    /// by its own id and a watch's markers are spread over the partitions; NATS: stream
    /// sequence). A begin and an end marker may share one timestamp.
    pub order: i64,
    /// Where reading starts to include it (Kafka: its timestamp; NATS: its stream sequence).
    pub start: i64,
    /// The marker.
    pub marker: Marker,
}

/// The start of the earliest begin marker among each watch's latest completed snapshot whose
/// begin marker was found; `None` when no watch has one.
pub(crate) fn start(found: &[Found]) -> Option<i64> {
    let mut by_watch: HashMap<(&str, &str), Vec<&Found>> = HashMap::new();
    for f in found {
        let watch = (f.marker.cluster.as_str(), f.marker.watch.as_str());
        by_watch.entry(watch).or_default().push(f);
    }
    by_watch
        .into_values()
        .filter_map(|mut markers| {
            markers.sort_by_key(|f| f.order);
            latest_complete_begin(&markers)
        })
        .min()
}

/// The start of the begin marker of the latest completed snapshot among one watch's `markers`
/// (in order) whose begin marker is among them.
fn latest_complete_begin(markers: &[&Found]) -> Option<i64> {
    markers.iter().rev().find_map(|end| {
        let complete = matches!(
            end.marker.kind,
            MarkerKind::End {
                result: SnapshotResult::Complete,
                ..
            }
        );
        if !complete {
            return None;
        }
        markers
            .iter()
            .filter(|b| b.order <= end.order && b.marker.snapshot_id == end.marker.snapshot_id)
            .find(|b| matches!(b.marker.kind, MarkerKind::Begin { .. }))
            .map(|b| b.start)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(order: i64, watch: &str, id: &str, kind: MarkerKind) -> Found {
        Found {
            order,
            start: order * 10,
            marker: Marker {
                id: format!("{id}:{watch}:x"),
                snapshot_id: id.into(),
                kind,
                time: None,
                cluster: "c".into(),
                api_version: "v1".into(),
                resource: "configmaps".into(),
                namespace: None,
                watch: watch.into(),
            },
        }
    }

    fn begin(order: i64, watch: &str, id: &str) -> Found {
        let kind = MarkerKind::Begin {
            label_selector: None,
            expected: Some(1),
        };
        found(order, watch, id, kind)
    }

    fn end(order: i64, watch: &str, id: &str, result: SnapshotResult) -> Found {
        let kind = MarkerKind::End {
            sent: 1,
            skipped: 0,
            pruned: 0,
            result,
        };
        found(order, watch, id, kind)
    }

    #[test]
    fn the_latest_completed_snapshot_with_its_begin_marker_is_the_start() {
        let markers = [
            begin(1, "w", "old"),
            end(2, "w", "old", SnapshotResult::Complete),
            begin(3, "w", "new"),
            end(4, "w", "new", SnapshotResult::Complete),
            // A later one that failed, and one still running: not complete.
            begin(5, "w", "failed"),
            end(6, "w", "failed", SnapshotResult::Failed("deleted".into())),
            begin(7, "w", "running"),
        ];
        assert_eq!(start(&markers), Some(30));
    }

    #[test]
    fn an_end_marker_without_its_begin_marker_falls_back_to_an_older_snapshot() {
        let markers = [
            begin(1, "w", "old"),
            end(2, "w", "old", SnapshotResult::Complete),
            end(4, "w", "compacted", SnapshotResult::Complete),
        ];
        assert_eq!(start(&markers), Some(10));
        assert_eq!(start(&markers[2..]), None, "no begin marker at all");
    }

    #[test]
    fn a_begin_and_its_end_marker_stamped_in_one_millisecond_are_a_snapshot() {
        let markers = [
            begin(1, "w", "old"),
            end(2, "w", "old", SnapshotResult::Complete),
            begin(3, "w", "new"),
            end(3, "w", "new", SnapshotResult::Complete),
        ];
        assert_eq!(start(&markers), Some(30));
    }

    #[test]
    fn with_several_watches_the_earliest_of_their_latest_snapshots_is_the_start() {
        let markers = [
            begin(1, "a", "a1"),
            end(2, "a", "a1", SnapshotResult::Complete),
            begin(3, "b", "b1"),
            end(5, "b", "b1", SnapshotResult::Complete),
            begin(6, "a", "a2"),
            end(7, "a", "a2", SnapshotResult::Complete),
        ];
        assert_eq!(start(&markers), Some(30), "b's only snapshot began at 3");
    }
}
