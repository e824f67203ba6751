//! The commit rules of one turn of the pipeline's loop, as a pure function: from what the
//! pipeline knows at the top of a turn ([`Facts`]) to what the turn may do ([`Turn`], with its
//! [`Phase`]). The loop in `Pipeline::run` only gathers the facts and performs the turn, so these
//! rules are tested here without I/O.

use std::time::Duration;

/// What the pipeline knows at the top of a turn.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Facts {
    /// Events are sent in transactions committed with the checkpoint.
    pub transactional: bool,
    /// The watch is listing.
    pub listing: bool,
    /// Progress was made since the last commit.
    pub uncommitted: bool,
    /// Events of the open transaction are held for a possible resend.
    pub held: bool,
    /// The held events reached the most a transaction may hold in memory.
    pub held_full: bool,
    /// Since the start of the last commit.
    pub elapsed: Duration,
    /// The commit cadence now (the sink's, or the checkpoint interval while listing).
    pub interval: Duration,
    /// `checkpoint.intervalMs`.
    pub checkpoint_interval: Duration,
    /// Changes wait in the watch's queue.
    pub queued: bool,
    /// A checkpoint is being written while the watch goes on.
    pub saving: bool,
    /// Another watch sharing the transaction asked this one to commit.
    pub requested: bool,
    /// A commit fell due in an earlier turn and was not made yet.
    pub commit_due: bool,
    /// Events await their acknowledgement.
    pub in_flight: bool,
    /// A snapshot's mark waits for what the open transaction holds to commit.
    pub mark_waits: bool,
}

/// What a turn is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// No commit is due: changes are taken while there is room.
    Taking,
    /// A commit is due and events are in flight: intake stops until they are acknowledged.
    Draining,
    /// A commit is due and nothing is in flight: it is made now.
    Committing,
}

/// What a turn may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Turn {
    /// The phase.
    pub phase: Phase,
    /// Whether a commit is due, kept until it is made.
    pub commit_due: bool,
    /// Whether a commit would carry progress (a checkpoint).
    pub pending: bool,
    /// Whether the open transaction is committed without progress: a listing one holding events
    /// (committed as it goes), or one a snapshot's mark waits for.
    pub flushing: bool,
    /// Whether the turn may sleep until the commit cadence (nothing to take or await first).
    pub wait_for_cadence: bool,
}

impl Turn {
    /// The turn `facts` call for.
    ///
    /// A commit falls due when the held events fill their budget, when the checkpoint interval
    /// has passed, or when the cadence has passed and nothing waits to be taken (each commit then
    /// holds everything that queued during the one before). Once due it stays due until made:
    /// intake stops and what is in flight is acknowledged first (re-deciding after the drain
    /// would take the queued events in, and under steady load never find the queue empty). A
    /// commit waits for a checkpoint being written. A listing transaction holding events commits
    /// as it goes, so that none outgrows the broker's timeout or this process's memory, and so
    /// does one whose snapshot on demand waits for a mark; a watch asked by another sharing its
    /// transaction commits whatever it holds.
    pub(super) fn decide(f: Facts) -> Turn {
        let pending = f.uncommitted && !f.listing;
        let flushing = f.transactional && (f.listing && f.held || f.mark_waits);
        let commit_due = f.commit_due
            || f.held_full
            || f.elapsed >= f.interval.max(f.checkpoint_interval)
            || (f.elapsed >= f.interval && !f.queued);
        let due = !f.saving && (commit_due && (pending || flushing) || f.requested);
        let phase = match (due, f.in_flight) {
            (false, _) => Phase::Taking,
            (true, true) => Phase::Draining,
            (true, false) => Phase::Committing,
        };
        Turn {
            phase,
            commit_due,
            pending,
            flushing,
            wait_for_cadence: (pending || flushing) && !f.in_flight && !f.queued && !f.saving,
        }
    }

    /// Whether a commit is due this turn.
    pub(super) fn due(&self) -> bool {
        self.phase != Phase::Taking
    }
}

/// How long after the start of the last commit the next is due, given the sink's commit cadence
/// (`sink`, for a sink with transactions). A Kafka watch that is not listing commits on its sink's
/// cadence (`sink.kafka.commitIntervalMs`), every commit carrying the checkpoint, so
/// `read_committed` consumers see events within a few tens of milliseconds; during a list its
/// events are committed in chunks every `checkpoint.intervalMs` (or at `HELD_BYTES_MAX`), large
/// transactions for throughput, unless reservations wait for the byte budget (`starved`): the
/// held events' reservations are then given back on the sink's cadence, as the waiting watch
/// could not read on before the chunk's end otherwise. Other sinks save every
/// `checkpoint.intervalMs`.
pub(super) fn cadence(
    sink: Option<Duration>,
    checkpoint_interval: Duration,
    listing: bool,
    starved: bool,
) -> Duration {
    match sink {
        Some(sink) if !listing || starved => sink,
        _ => checkpoint_interval,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A Kafka watch past its list, 10 ms after its last commit, on a 50 ms cadence and a
    /// 500 ms checkpoint interval, with progress to commit and nothing queued or in flight.
    fn live() -> Facts {
        Facts {
            transactional: true,
            uncommitted: true,
            elapsed: 10 * MS,
            interval: 50 * MS,
            checkpoint_interval: 500 * MS,
            ..Facts::default()
        }
    }

    #[test]
    fn a_snapshot_mark_has_the_open_transaction_committed_on_the_cadence_without_progress() {
        let waiting = Facts {
            uncommitted: false,
            mark_waits: true,
            elapsed: 60 * MS,
            ..live()
        };
        let turn = Turn::decide(waiting);
        assert_eq!(turn.phase, Phase::Committing);
        assert!(
            turn.flushing && !turn.pending,
            "a commit without a checkpoint"
        );
        let early = Turn::decide(Facts {
            elapsed: 10 * MS,
            ..waiting
        });
        assert_eq!(early.phase, Phase::Taking);
        assert!(
            early.wait_for_cadence,
            "it waits for the cadence, not for progress"
        );
        let plain = Turn::decide(Facts {
            mark_waits: false,
            ..waiting
        });
        assert_eq!(plain.phase, Phase::Taking, "nothing to commit otherwise");
    }

    #[test]
    fn before_the_cadence_the_watch_takes_changes_and_may_sleep_until_it() {
        let turn = Turn::decide(live());
        assert_eq!(turn.phase, Phase::Taking);
        assert!(!turn.commit_due && turn.pending && turn.wait_for_cadence);
    }

    #[test]
    fn at_the_cadence_a_commit_waits_for_the_queue_but_not_past_the_checkpoint_interval() {
        let queued = Facts {
            elapsed: 60 * MS,
            queued: true,
            ..live()
        };
        assert_eq!(Turn::decide(queued).phase, Phase::Taking);
        let quiet = Facts {
            queued: false,
            ..queued
        };
        assert_eq!(Turn::decide(quiet).phase, Phase::Committing);
        let late = Facts {
            elapsed: 500 * MS,
            ..queued
        };
        assert_eq!(Turn::decide(late).phase, Phase::Committing);
    }

    #[test]
    fn a_due_commit_stays_due_and_drains_what_is_in_flight_first() {
        let draining = Facts {
            commit_due: true,
            in_flight: true,
            queued: true,
            ..live()
        };
        let turn = Turn::decide(draining);
        assert_eq!(turn.phase, Phase::Draining);
        assert!(turn.commit_due && !turn.wait_for_cadence);
    }

    #[test]
    fn a_commit_waits_for_the_checkpoint_being_written() {
        let saving = Facts {
            commit_due: true,
            saving: true,
            ..live()
        };
        let turn = Turn::decide(saving);
        assert_eq!(turn.phase, Phase::Taking);
        assert!(turn.commit_due, "still due once the save is written");
        assert!(!turn.wait_for_cadence);
    }

    #[test]
    fn a_listing_transaction_commits_what_it_holds_and_never_a_checkpoint() {
        let listing = Facts {
            listing: true,
            held: true,
            elapsed: 600 * MS,
            ..live()
        };
        let turn = Turn::decide(listing);
        assert_eq!(turn.phase, Phase::Committing);
        assert!(turn.flushing && !turn.pending);
        let files = Facts {
            transactional: false,
            ..listing
        };
        assert_eq!(Turn::decide(files).phase, Phase::Taking);
    }

    #[test]
    fn held_events_over_their_budget_make_a_commit_due_at_once() {
        let full = Facts {
            held_full: true,
            queued: true,
            ..live()
        };
        assert_eq!(Turn::decide(full).phase, Phase::Committing);
    }

    #[test]
    fn a_listing_transaction_commits_on_the_sinks_cadence_only_while_reservations_wait() {
        let (sink, checkpoint) = (Some(50 * MS), 500 * MS);
        assert_eq!(cadence(sink, checkpoint, false, false), 50 * MS, "live");
        assert_eq!(cadence(sink, checkpoint, true, false), 500 * MS, "chunks");
        assert_eq!(cadence(sink, checkpoint, true, true), 50 * MS, "starved");
        assert_eq!(
            cadence(None, checkpoint, true, true),
            500 * MS,
            "no transactions"
        );
        assert_eq!(cadence(None, checkpoint, false, false), 500 * MS);
        let starved = Facts {
            listing: true,
            held: true,
            queued: false,
            elapsed: 60 * MS,
            interval: cadence(sink, checkpoint, true, true),
            ..live()
        };
        let turn = Turn::decide(starved);
        assert_eq!(turn.phase, Phase::Committing);
        assert!(turn.flushing && !turn.pending, "held events, no checkpoint");
        let fed = Facts {
            interval: cadence(sink, checkpoint, true, false),
            ..starved
        };
        assert_eq!(Turn::decide(fed).phase, Phase::Taking);
    }

    #[test]
    fn a_request_of_a_watch_sharing_the_transaction_commits_even_without_progress() {
        let asked = Facts {
            uncommitted: false,
            requested: true,
            ..live()
        };
        assert_eq!(Turn::decide(asked).phase, Phase::Committing);
        let nothing = Facts {
            requested: false,
            elapsed: 600 * MS,
            ..asked
        };
        assert_eq!(Turn::decide(nothing).phase, Phase::Taking);
    }
}
