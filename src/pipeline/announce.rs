//! Announcing objects before their first event is sent, for sinks whose events are not stored
//! with the checkpoint (see [`crate::checkpoint::announce`]): what the watch took in one go is
//! classified, the objects among it published for the first time are announced in one write,
//! then everything is sent in order.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{error, warn};

use super::classify::Step;
use super::delivery::{UNANSWERED, awaiting_broker, log_resumed, report_stall};
use super::{Pipeline, Result, State};
use crate::budget::Reservation;
use crate::checkpoint::{self, announce};
use crate::known::StoredEntry;
use crate::status::STALL_AFTER;
use crate::watch::Item;

/// Announcements that fail are retried at least this often.
const RETRY_MAX: Duration = Duration::from_secs(5);

/// How long the items of a list are gathered for one announcement at most.
const LIST_GATHER: Duration = Duration::from_millis(20);

impl Pipeline {
    /// Takes one item from the watch and publishes what it produced. When that is the first
    /// event of an object and the store announces, the items ready behind it (during a list,
    /// also those that come within [`LIST_GATHER`]; up to [`announce::BATCH`]) are taken with it,
    /// and the objects they publish first are announced in one write before any is sent.
    pub(super) async fn take(
        &mut self,
        item: Item,
        reservation: Reservation,
        rx: &mut mpsc::Receiver<(Item, Reservation)>,
        st: &mut State,
    ) -> Result<()> {
        let mut taken = vec![(self.classify(item, st), reservation)];
        if self.store.announces() && self.first(&taken[0].0).is_some() {
            // A list's items come as fast as its pages decode: it waits a little for more, so
            // that its objects are announced in few writes; live events never wait.
            let until = Instant::now() + LIST_GATHER;
            while taken.len() < announce::BATCH {
                let next = match rx.try_recv() {
                    Ok(next) => next,
                    Err(_) if st.classifier.listing() => {
                        match tokio::time::timeout_at(until, rx.recv()).await {
                            Ok(Some(next)) => next,
                            _ => break,
                        }
                    }
                    Err(_) => break,
                };
                taken.push((self.classify(next.0, st), next.1));
            }
            let entries: Vec<StoredEntry> = taken
                .iter()
                .filter_map(|(step, _)| self.first(step))
                .collect();
            self.announce(&entries, st).await?;
        }
        for (step, reservation) in taken {
            self.apply(step, reservation, st).await?;
        }
        if !st.demands.is_empty() {
            // The stream moved: a held snapshot object may be decided now.
            self.advance_demands(st).await?;
        }
        Ok(())
    }

    /// The object whose first event `step` publishes (unless the events filter drops it), as
    /// an announcement stores it.
    fn first(&self, step: &Step) -> Option<StoredEntry> {
        let change = step.change.as_ref().filter(|_| step.first)?;
        if !self.events.contains(&change.kind) {
            return None;
        }
        let meta = &change.object.metadata;
        Some((
            meta.uid.as_deref()?.into(),
            meta.resource_version.as_deref()?.into(),
            meta.namespace.as_deref().map(Into::into),
            meta.name.as_deref()?.into(),
            0,
        ))
    }

    /// Stores the announcement of `entries`, after the save being written (announcements are
    /// tied to the checkpoint stored). Nothing is sent until it is stored: a failure is retried
    /// with backoff, and reported as a stall once it has lasted [`STALL_AFTER`]; fencing stops
    /// the watch.
    async fn announce(&mut self, entries: &[StoredEntry], st: &mut State) -> Result<()> {
        self.finish_saving(st).await?;
        let mut backoff = crate::backoff::Backoff::default();
        let since = Instant::now();
        loop {
            self.check_leadership()?;
            let stored = self.store.announce(entries);
            match awaiting_broker(&self.status, "announcement", stored).await {
                Ok(()) => {
                    if let Some(stall) = self.status.clear_stall_if(UNANSWERED) {
                        log_resumed(&stall);
                    }
                    return Ok(());
                }
                Err(e @ checkpoint::Error::Fenced { .. }) => {
                    error!(error = %e, "fenced: another instance owns this watch now");
                    return Err(e.into());
                }
                Err(e) => {
                    let message = format!("announcement of objects not stored: {e}");
                    if since.elapsed() >= STALL_AFTER {
                        report_stall(&self.status, UNANSWERED, &message, None);
                    }
                    let delay = backoff.next_delay().min(RETRY_MAX);
                    warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "announcement not stored, retrying");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }
}
