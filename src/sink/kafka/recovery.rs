//! What follows a failed transactional call, decided without I/O: resume the call, give up on the
//! transaction (its events are sent again after an abort), replace the producer, or stop because
//! another instance owns the transactional id.
//!
//! librdkafka's rules (rdkafka.h, `rd_kafka_commit_transaction` and `rd_kafka_abort_transaction`):
//! a call that fails with a retriable error (`_TIMED_OUT`: the broker did not answer within the
//! call's timeout) goes on in the background and is resumed by calling it again; until then any
//! other transactional call is refused with `_CONFLICT` ("conflicting commit_transaction API call
//! is already in progress"), so aborting a commit that timed out can never succeed. A call refused
//! with `_STATE` finds the producer where it does not expect it. A fatal error (fencing among
//! them) leaves the producer unusable. In all three cases only a new producer goes on: its
//! `init_transactions` completes or aborts whatever the old one left open.
//!
//! A commit left unanswered for [`COMMIT_ATTEMPTS`] calls is given up, and the producer replaced
//! without trying to abort: the abort is refused while librdkafka still runs the commit, and when
//! what went unanswered is the commit's flush, the producer may no longer move the transaction at
//! all. librdkafka 2.12 can end up there after a pause of Kafka past the broker's session timeout:
//! the broker comes back fenced by its controller, so a metadata response leaves it out and
//! librdkafka decommissions the broker it knew (then reports all brokers down and re-bootstraps).
//! A request in flight to that broker ends with `_DESTROY`, and a transaction coordinator query
//! ending so is dropped without being asked again (`rd_kafka_txn_handle_FindCoordinator`): with
//! no coordinator, the partitions of the next transaction are never registered, so its records
//! are never sent, its commit's flush times out call after call, and an abort does too. An abort
//! left unanswered for [`ABORT_ATTEMPTS`] calls replaces the producer for the same reason.
//!
//! # Fencing: a rival, or the coordinator's timeout
//!
//! The coordinator refuses a producer's epoch (`_FENCED`, from `PRODUCER_FENCED` or
//! `INVALID_PRODUCER_EPOCH`) in two cases that look the same to the producer:
//! - another producer with the same transactional id called `init_transactions` (a newer
//!   instance, a new leader, the new owner of a shard's watch, `kube-event-bridge snapshot`):
//!   this one must stop;
//! - the coordinator aborted the open transaction because it stayed open longer than the
//!   transaction timeout (an outage of the broker or of its network, this process paused), and
//!   bumped the epoch as it did (KIP-890): no one else is involved.
//!
//! The coordinator's timer starts when the transaction's first record reaches it, after this
//! process handed that record over; so the second case can only be seen once the transaction
//! has been open here for longer than the timeout. [`fence`] reads a fence as the coordinator's
//! timeout only then, and only while this process still owns the transactional id (its leader
//! Lease or watch Lease is valid; without either the process owns it). Any other fence is a
//! rival's, and stops the watches sharing the producer, as before.
//!
//! Why two instances cannot fence each other for ever: after a fence read as the timeout, the
//! producer is replaced, and the new producer's `init_transactions` fences a rival if there was
//! one. That rival has no transaction open, or one younger than the timeout (it commits within
//! milliseconds while it reaches the broker), so it reads a rival's fence and stops. The
//! replacement itself starts with no transaction open, so a fence that reaches it within a
//! transaction timeout is read as a rival's and stops it. A second swap thus needs both
//! instances, in turn, to be unable to commit for a whole transaction timeout; two instances that
//! reach the broker swap at most once. Under leader election or sharding, the one whose Lease
//! lapsed never replaces its producer.

use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// A commit that did not finish is resumed this many times at most (each call waits up to its
/// call timeout, 30 s): a commit the coordinator received completes as soon as it answers; past
/// that the transaction is given up, and the new producer's `init_transactions` completes or
/// aborts it.
pub(super) const COMMIT_ATTEMPTS: u32 = 3;

/// An abort that did not finish is resumed this many times at most; past that the producer is
/// replaced (an abort left unanswered for so long waits for what the producer no longer moves,
/// or for a broker that is away: then the new producer's `init_transactions` fails too, and the
/// caller tries again later).
pub(super) const ABORT_ATTEMPTS: u32 = 2;

/// How a transactional call failed, as far as what comes next is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Failure {
    /// It did not finish within its timeout and goes on in the background: calling it again
    /// resumes it (a retriable error, `_TIMED_OUT` mostly).
    Unfinished,
    /// Another transactional call is still under way (`_CONFLICT`), or the producer is not in the
    /// state the call needs (`_STATE`): only a new producer gets out.
    Stuck,
    /// The coordinator refused the producer's epoch (see [`fence`]).
    Fenced,
    /// The producer failed for good, not by fencing.
    Broken,
    /// Anything else: the transaction cannot commit; it is aborted and its events sent again.
    Failed,
}

/// What an error of `rd_kafka_*_transaction` (or of a send) means here.
pub(super) fn failure(e: &KafkaError) -> Failure {
    use RDKafkaErrorCode as C;
    match e {
        KafkaError::Transaction(t) => failure_of(t.code(), t.is_retriable(), t.is_fatal()),
        // A commit's flush that did not finish in time: committing again flushes again, as
        // librdkafka's own commit reports it (a retriable `_TIMED_OUT`).
        KafkaError::Flush(C::OperationTimedOut) => Failure::Unfinished,
        other => match other.rdkafka_error_code() {
            Some(code) => failure_of(code, false, code == RDKafkaErrorCode::Fatal),
            None => Failure::Failed,
        },
    }
}

/// [`failure`] from the error's code and flags. `_CONFLICT` is retriable for librdkafka (the
/// other call may end), but the other call is the commit that timed out, which only the caller
/// could resume: it is [`Failure::Stuck`].
pub(super) fn failure_of(code: RDKafkaErrorCode, retriable: bool, fatal: bool) -> Failure {
    use RDKafkaErrorCode as C;
    match code {
        C::Fenced | C::ProducerFenced | C::InvalidProducerEpoch => Failure::Fenced,
        C::Conflict | C::State => Failure::Stuck,
        _ if fatal || code == C::Fatal => Failure::Broken,
        _ if retriable => Failure::Unfinished,
        _ => Failure::Failed,
    }
}

/// Whether a call that failed on its `attempt`-th try (from 1) is called again.
pub(super) fn resume(failure: Failure, attempt: u32, attempts: u32) -> bool {
    failure == Failure::Unfinished && attempt < attempts
}

/// Who fenced the producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fence {
    /// Another instance with the same transactional id: stop.
    Rival,
    /// The coordinator, aborting a transaction open longer than the transaction timeout: replace
    /// the producer and send again.
    Timeout,
}

/// Reads a fence (see the module's documentation): the coordinator's timeout when the open
/// transaction has held records for longer than `timeout` (`open_for`, `None` when it holds
/// none) and this process still owns the transactional id; a rival otherwise.
pub(super) fn fence(open_for: Option<Duration>, timeout: Duration, owned: bool) -> Fence {
    match open_for {
        Some(open) if owned && open > timeout => Fence::Timeout,
        _ => Fence::Rival,
    }
}

/// What a failed abort leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AfterAbort {
    /// A new producer with the same transactional id.
    Replace,
    /// Another instance owns the transactional id.
    Fenced,
    /// The abort failed otherwise: try again later.
    Later,
}

/// What an abort that failed with `failure` (and, if fenced, `fence`) leads to.
pub(super) fn after_abort(failure: Failure, fence: Fence) -> AfterAbort {
    match (failure, fence) {
        (Failure::Fenced, Fence::Rival) => AfterAbort::Fenced,
        (Failure::Fenced, Fence::Timeout)
        | (Failure::Stuck | Failure::Broken | Failure::Unfinished, _) => AfterAbort::Replace,
        (Failure::Failed, _) => AfterAbort::Later,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use RDKafkaErrorCode as C;

    #[test]
    fn failures_are_sorted_by_what_gets_out_of_them() {
        let table = [
            // (code, retriable, fatal) → failure
            ((C::OperationTimedOut, true, false), Failure::Unfinished),
            ((C::RequestTimedOut, true, false), Failure::Unfinished),
            ((C::Conflict, true, false), Failure::Stuck),
            ((C::State, false, false), Failure::Stuck),
            ((C::Fenced, false, true), Failure::Fenced),
            ((C::ProducerFenced, false, true), Failure::Fenced),
            ((C::InvalidProducerEpoch, false, false), Failure::Fenced),
            ((C::Fatal, false, false), Failure::Broken),
            (
                (C::TransactionalIdAuthorizationFailed, false, true),
                Failure::Broken,
            ),
            ((C::MessageSizeTooLarge, false, false), Failure::Failed),
        ];
        for ((code, retriable, fatal), want) in table {
            assert_eq!(failure_of(code, retriable, fatal), want, "{code:?}");
        }
        let fenced = KafkaError::MessageProduction(C::Fenced);
        assert_eq!(failure(&fenced), Failure::Fenced);
        assert_eq!(failure(&KafkaError::Canceled), Failure::Failed);
        let flush = KafkaError::Flush(C::OperationTimedOut);
        assert_eq!(failure(&flush), Failure::Unfinished);
        assert_eq!(failure(&KafkaError::Flush(C::Fail)), Failure::Failed);
    }

    #[test]
    fn only_an_unfinished_call_is_resumed_and_only_so_often() {
        assert!(resume(Failure::Unfinished, 1, COMMIT_ATTEMPTS));
        assert!(resume(
            Failure::Unfinished,
            COMMIT_ATTEMPTS - 1,
            COMMIT_ATTEMPTS
        ));
        assert!(!resume(
            Failure::Unfinished,
            COMMIT_ATTEMPTS,
            COMMIT_ATTEMPTS
        ));
        for other in [
            Failure::Stuck,
            Failure::Fenced,
            Failure::Broken,
            Failure::Failed,
        ] {
            assert!(!resume(other, 1, COMMIT_ATTEMPTS), "{other:?}");
        }
    }

    #[test]
    fn a_fence_is_the_timeout_only_past_it_and_while_owned() {
        let timeout = Duration::from_secs(60);
        let past = Some(Duration::from_secs(61));
        let within = Some(Duration::from_secs(59));
        let table = [
            // (open for, owned) → fence
            ((past, true), Fence::Timeout),
            ((past, false), Fence::Rival),
            ((within, true), Fence::Rival),
            ((Some(timeout), true), Fence::Rival),
            ((None, true), Fence::Rival),
        ];
        for ((open, owned), want) in table {
            assert_eq!(fence(open, timeout, owned), want, "{open:?} {owned}");
        }
    }

    #[test]
    fn a_failed_abort_replaces_the_producer_unless_a_rival_owns_it() {
        let table = [
            // (failure, fence) → next
            ((Failure::Stuck, Fence::Rival), AfterAbort::Replace),
            ((Failure::Broken, Fence::Rival), AfterAbort::Replace),
            ((Failure::Fenced, Fence::Timeout), AfterAbort::Replace),
            ((Failure::Fenced, Fence::Rival), AfterAbort::Fenced),
            ((Failure::Unfinished, Fence::Rival), AfterAbort::Replace),
            ((Failure::Failed, Fence::Timeout), AfterAbort::Later),
        ];
        for ((failure, fence), want) in table {
            assert_eq!(after_abort(failure, fence), want, "{failure:?} {fence:?}");
        }
    }
}
