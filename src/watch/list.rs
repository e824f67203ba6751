//! The paged LIST: a consistent read in pages bounded in objects and bytes, sent down the
//! pipeline between [`Item::ListBegin`] and [`Item::ListEnd`], with a progress line every ten
//! seconds.

use std::time::{Duration, Instant, SystemTime};

use kube::api::{DynamicObject, ListParams};
use tokio::sync::mpsc;
use tracing::info;

use super::{Error, Item, Target, send};
use crate::budget;

/// Lists every object (paginated, consistent read) and sends them between `ListBegin` and
/// `ListEnd`; returns the list's resourceVersion.
pub(super) async fn list(target: &Target, tx: &mpsc::Sender<Item>) -> Result<String, Error> {
    // Object sizes are unknown until the first page: it is kept small.
    let mut params = ListParams::default().limit(target.page_size.min(FIRST_PAGE));
    if let Some(l) = &target.label_selector {
        params = params.labels(l);
    }
    if let Some(f) = &target.field_selector {
        params = params.fields(f);
    }
    send(tx, Item::ListBegin).await?;
    let mut progress = ListProgress::new("list", Instant::now());
    let list_rv = loop {
        let page = match target.api.list(&params).await {
            Ok(page) => page,
            Err(source) => {
                send(tx, Item::ListAbort).await?;
                return Err(match source {
                    kube::Error::SerdeError(_) => Error::Decode {
                        what: "a LIST response",
                        source,
                    },
                    source => Error::Request {
                        reason: "list",
                        source,
                    },
                });
            }
        };
        let observed = SystemTime::now();
        let average = average_size(&page.items);
        let listed = page.items.len();
        for mut object in page.items {
            object.types.get_or_insert_with(|| target.types.clone());
            send(tx, Item::Listed(Box::new(object), observed)).await?;
        }
        progress.count(listed, listed * average);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => {
                params = params.continue_token(&token);
                params.limit = Some(page_limit(target, average));
            }
            None => break page.metadata.resource_version.unwrap_or_default(),
        }
    };
    progress.listed(&list_rv);
    send(tx, Item::ListEnd(list_rv.clone())).await?;
    Ok(list_rv)
}

/// How often a long list logs how far it has come.
const LIST_PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// How far a list has come: objects and (estimated) bytes so far.
#[derive(Debug, Clone, Copy)]
pub(super) struct ListProgress {
    /// `list` (paged) or `stream`, as its log lines say.
    method: &'static str,
    started: Instant,
    reported: Instant,
    objects: usize,
    bytes: usize,
}

/// A progress line: totals so far, the time since the LIST began and the rate over it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct ProgressLine {
    objects: usize,
    bytes: usize,
    per_sec: u64,
    secs: f64,
}

impl ListProgress {
    /// A list by `method` that began at `now`.
    pub(super) fn new(method: &'static str, now: Instant) -> Self {
        Self {
            method,
            started: now,
            reported: now,
            objects: 0,
            bytes: 0,
        }
    }

    /// Counts a page of `objects` (about `bytes`) taken at `now`; a line to log when
    /// [`LIST_PROGRESS_EVERY`] has passed since the LIST began or the last line.
    fn page(&mut self, objects: usize, bytes: usize, now: Instant) -> Option<ProgressLine> {
        self.objects += objects;
        self.bytes += bytes;
        if now.duration_since(self.reported) < LIST_PROGRESS_EVERY {
            return None;
        }
        self.reported = now;
        Some(self.total(now))
    }

    /// Counts `objects` (about `bytes`) just listed, logging a progress line when one is due.
    pub(super) fn count(&mut self, objects: usize, bytes: usize) {
        if let Some(p) = self.page(objects, bytes, Instant::now()) {
            info!(
                method = self.method,
                objects = p.objects,
                bytes = p.bytes,
                objects_per_sec = p.per_sec,
                "listing"
            );
        }
    }

    /// Logs the end of the list, at resourceVersion `rv`, with its totals.
    pub(super) fn listed(&self, rv: &str) {
        let total = self.total(Instant::now());
        info!(
            rv,
            method = self.method,
            objects = total.objects,
            bytes = total.bytes,
            objects_per_sec = total.per_sec,
            secs = total.secs,
            "listed"
        );
    }

    /// The totals at `now`, for a progress line or the line of the list's end.
    fn total(&self, now: Instant) -> ProgressLine {
        let secs = now.duration_since(self.started).as_secs_f64();
        ProgressLine {
            objects: self.objects,
            bytes: self.bytes,
            per_sec: (self.objects as f64 / secs.max(f64::EPSILON)) as u64,
            secs,
        }
    }
}

/// Objects on the first LIST page, before their sizes are known.
pub(super) const FIRST_PAGE: u32 = 100;

/// Objects on the next LIST page: as many as fit `target.page_bytes` at the last page's average
/// object size, between 1 and `target.page_size`.
fn page_limit(target: &Target, average: usize) -> u32 {
    if average == 0 {
        return target.page_size;
    }
    u32::try_from(target.page_bytes / average)
        .unwrap_or(u32::MAX)
        .clamp(1, target.page_size)
}

/// The average JSON size of `items`, from at most 16 of them spread over the page: sizing a page
/// needs an average, and each object is measured again for the watch's budget anyway.
fn average_size(items: &[DynamicObject]) -> usize {
    let step = items.len().div_ceil(16).max(1);
    let sample: Vec<usize> = items
        .iter()
        .step_by(step)
        .map(budget::object_size)
        .collect();
    match sample.len() {
        0 => 0,
        n => sample.iter().sum::<usize>().div_ceil(n),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::watch::fake_api::target;

    #[test]
    fn a_long_list_reports_its_progress_every_ten_seconds_with_its_totals_and_rate() {
        let t0 = Instant::now();
        let mut p = ListProgress::new("list", t0);
        let at = |secs| t0 + Duration::from_secs(secs);
        assert_eq!(p.page(500, 500_000, at(4)), None, "too soon");
        assert_eq!(
            p.page(500, 500_000, at(10)),
            Some(ProgressLine {
                objects: 1_000,
                bytes: 1_000_000,
                per_sec: 100,
                secs: 10.0,
            })
        );
        assert_eq!(
            p.page(1_000, 1_000_000, at(19)),
            None,
            "ten seconds after the last line"
        );
        let line = p.page(1_000, 1_000_000, at(20)).expect("a line");
        assert_eq!(
            (line.objects, line.bytes, line.per_sec),
            (3_000, 3_000_000, 150)
        );
        // The end's line has the totals whenever the last progress line was.
        assert_eq!(p.page(500, 500_000, at(21)), None);
        let end = p.total(at(25));
        assert_eq!(
            (end.objects, end.bytes, end.per_sec, end.secs),
            (3_500, 3_500_000, 140, 25.0)
        );
    }

    #[test]
    fn a_short_list_logs_no_progress_only_its_totals() {
        let t0 = Instant::now();
        let mut p = ListProgress::new("list", t0);
        assert_eq!(p.page(100, 10_000, t0 + Duration::from_millis(200)), None);
        assert_eq!(p.page(0, 0, t0 + Duration::from_millis(300)), None);
        let end = p.total(t0 + Duration::from_millis(500));
        assert_eq!((end.objects, end.bytes, end.per_sec), (100, 10_000, 200));
        // A LIST ending the instant it began has no rate to divide by zero.
        assert_eq!(ListProgress::new("list", t0).total(t0).per_sec, 0);
    }

    #[tokio::test]
    async fn pages_hold_what_fits_their_bytes_at_the_average_size() {
        let object = |bytes: usize| -> DynamicObject {
            serde_json::from_value(
                json!({"metadata": {"name": "x"}, "data": {"b": "x".repeat(bytes)}}),
            )
            .unwrap()
        };
        let items: Vec<DynamicObject> = (0..100).map(|_| object(1_000)).collect();
        let average = average_size(&items);
        assert_eq!(
            average,
            budget::serialized_size(&items[0]),
            "sampled, same size"
        );
        assert_eq!(average_size(&[]), 0);
        let client =
            kube::Client::try_from(kube::Config::new("http://127.0.0.1:1".parse().unwrap()))
                .unwrap();
        let mut t = target(client);
        t.page_bytes = 16 * average;
        assert_eq!(page_limit(&t, average), 16);
        assert_eq!(
            page_limit(&t, 0),
            t.page_size,
            "nothing measured: the largest page"
        );
        assert_eq!(page_limit(&t, usize::MAX), 1, "at least one object");
    }
}
