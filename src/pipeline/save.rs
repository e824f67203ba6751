//! Saving checkpoints. A save starts once every event before it is acknowledged. A NATS save
//! small enough to hold whole is encoded at once and written while the watch goes on taking,
//! sending and settling changes ([`Saving`]); the next save waits for it. Any other save is
//! made in place: a Kafka save commits the transaction the next events go into, a file is
//! rewritten, a very large compaction is written in batches.

use std::sync::atomic::Ordering;

use futures::future::BoxFuture;
use tokio::time::Instant;
use tracing::{error, warn};

use super::delivery::awaiting_broker;
use super::{Pipeline, Result, State};
use crate::checkpoint::{self, Staging, Written};

/// A checkpoint being written while the watch goes on.
pub(super) struct Saving {
    /// The resourceVersion it saves.
    resource_version: String,
    /// The write, reporting the watch stalled while the broker leaves it unanswered.
    write: BoxFuture<'static, Written>,
}

/// Resolves once the checkpoint being written is written; never if none is.
pub(super) async fn written(saving: &mut Option<Saving>) -> Written {
    match saving {
        Some(saving) => (&mut saving.write).await,
        None => std::future::pending().await,
    }
}

impl Pipeline {
    /// Saves a checkpoint at the current position (with nothing in flight), committing the open
    /// Kafka transaction with it.
    pub(super) async fn commit(&mut self, st: &mut State) -> Result<()> {
        self.finish_saving(st).await?;
        let Some(rv) = st.position.clone() else {
            // Nothing to checkpoint yet; a shared transaction still waits for this watch.
            return self.commit_events(st).await;
        };
        // The cadence counts from the start of a commit: the next is due once this one has
        // completed and the interval has passed.
        st.last_commit = Instant::now();
        self.check_leadership()?;
        if st.classifier.carried() > 0 {
            // Saving would drop their announcements: not before the watch has named them all.
            return Ok(());
        }
        let planned = match self.store.stage(&rv, st.classifier.known()) {
            Staging::Staged(staged) => {
                let status = self.status.clone();
                st.saving = Some(Saving {
                    resource_version: rv,
                    write: Box::pin(async move {
                        awaiting_broker(&status, "checkpoint save", staged.write()).await
                    }),
                });
                return Ok(());
            }
            Staging::InPlace(planned) => planned,
        };
        let saved = self.store.save_planned(&rv, st.classifier.known(), planned);
        let saved = awaiting_broker(&self.status, "checkpoint save", saved).await;
        let Some(e) = self.checkpoint_saved(saved, rv, st)? else {
            return Ok(());
        };
        if self.sink.transactions().is_some() {
            // The checkpoint records went down with the transaction.
            let broken = !matches!(e, checkpoint::Error::Aborted { .. });
            self.resend_after_abort(st, &e, broken).await?;
        } else {
            warn!(error = %e, "checkpoint not saved, will retry");
        }
        Ok(())
    }

    /// The checkpoint being written is written: applies it.
    pub(super) fn saved(&mut self, written: Written, st: &mut State) -> Result<()> {
        let Some(saving) = st.saving.take() else {
            return Ok(());
        };
        let saved = self.store.finish(written);
        if let Some(e) = self.checkpoint_saved(saved, saving.resource_version, st)? {
            warn!(error = %e, "checkpoint not saved, will retry");
        }
        Ok(())
    }

    /// Waits for the checkpoint being written, if any, and applies it.
    pub(super) async fn finish_saving(&mut self, st: &mut State) -> Result<()> {
        if st.saving.is_some() {
            let written = written(&mut st.saving).await;
            self.saved(written, st)?;
        }
        Ok(())
    }

    /// Counts a saved checkpoint. Fencing stops the watch; after another failure every index
    /// bucket is written with the next save (the changes taken by this one are not stored), and
    /// the failure is returned to be handled.
    fn checkpoint_saved(
        &self,
        saved: checkpoint::Result<()>,
        resource_version: String,
        st: &mut State,
    ) -> Result<Option<checkpoint::Error>> {
        match saved {
            Ok(()) => {
                self.status.checkpoints.fetch_add(1, Ordering::Relaxed);
                self.status.set_checkpointed(&resource_version);
                st.committed = Some(resource_version);
                st.flight.committed(&self.status.visible_latency);
                st.demands.committed();
                Ok(None)
            }
            Err(e @ checkpoint::Error::Fenced { .. }) => {
                error!(error = %e, "fenced: another instance owns this watch now");
                Err(e.into())
            }
            Err(e) => {
                st.classifier.known().mark_all_dirty();
                Ok(Some(e))
            }
        }
    }
}
