//! The stream adapter between a subscription and the store: applies each record with the
//! [`Writer`] and yields what changed.

use futures::{Stream, StreamExt, stream};

use crate::event::Record;
use crate::store::{Change, Outcome, Writer};

/// What a subscription reads: a record, or the news that it has caught up.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// One message, decoded, applied in reading order ([`Writer::apply`]).
    Record(Record),
    /// One message, decoded, with the time it was published (a Kafka record's timestamp in
    /// milliseconds: [`Writer::apply_at`]).
    Timestamped(Record, i64),
    /// Every partition or stream reached the position it had when reading started.
    CaughtUp,
}

/// Applies `inputs` to `writer`'s store and yields the changes (records that changed nothing,
/// duplicates and stale events, yield nothing; a snapshot's end marker yields the removals of
/// its completion and [`Change::SnapshotComplete`]). Errors pass through: they never end the
/// stream.
pub fn reflect<S, E>(mut writer: Writer, inputs: S) -> impl Stream<Item = Result<Change, E>>
where
    S: Stream<Item = Result<Input, E>>,
{
    inputs.flat_map(move |input| {
        let out = match input {
            Ok(Input::Record(record)) => changes(writer.apply(record)),
            Ok(Input::Timestamped(record, at)) => changes(writer.apply_at(record, at)),
            Ok(Input::CaughtUp) => {
                writer.caught_up();
                vec![Ok(Change::CaughtUp)]
            }
            Err(error) => vec![Err(error)],
        };
        stream::iter(out)
    })
}

/// The changes of one outcome.
fn changes<E>(outcome: Outcome) -> Vec<Result<Change, E>> {
    match outcome {
        Outcome::Changed(change) => vec![Ok(change)],
        Outcome::Marker(changes) => changes.into_iter().map(Ok).collect(),
        Outcome::Duplicate | Outcome::Stale | Outcome::Unknown => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;
    use crate::event::ChangeType::{Added, Deleted};
    use crate::store::tests::{event, rec};

    #[tokio::test]
    async fn the_stream_of_changes_skips_what_changed_nothing_and_reports_catching_up() {
        let writer = Writer::new();
        let store = writer.store();
        let a = event("a", "u1", 10, Added, "1");
        let inputs = vec![
            Ok::<_, std::convert::Infallible>(Input::Record(rec(a.clone()))),
            Ok(Input::Record(rec(a))),
            Ok(Input::Record(rec(event("b", "u2", 11, Added, "1")))),
            Ok(Input::CaughtUp),
            Ok(Input::Record(rec(event("b", "u2", 12, Deleted, "1")))),
        ];
        assert!(!store.is_ready());
        let changes: Vec<Change> = reflect(writer, futures::stream::iter(inputs))
            .map(Result::unwrap)
            .collect()
            .await;
        let kinds: Vec<&str> = changes
            .iter()
            .map(|c| match c {
                Change::Applied { .. } => "applied",
                Change::Deleted { .. } => "deleted",
                Change::CaughtUp => "caught up",
                Change::SnapshotComplete { .. } => "snapshot complete",
            })
            .collect();
        assert_eq!(kinds, ["applied", "applied", "caught up", "deleted"]);
        store.wait_until_ready().await;
        assert_eq!(
            store
                .list()
                .iter()
                .map(|o| o.uid.as_str())
                .collect::<Vec<_>>(),
            ["u1"]
        );
    }
}
