//! The stream adapter between a subscription and the store: applies each record with the
//! [`Writer`] and yields what changed.

use futures::{Stream, StreamExt, future};

use crate::event::Record;
use crate::store::{Change, Outcome, Writer};

/// What a subscription reads: a record, or the news that it has caught up.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// One message, decoded.
    Record(Record),
    /// Every partition or stream reached the position it had when reading started.
    CaughtUp,
}

/// Applies `inputs` to `writer`'s store and yields the changes (records that changed nothing,
/// duplicates and stale events, yield nothing). Errors pass through: they never end the stream.
pub fn reflect<S, E>(mut writer: Writer, inputs: S) -> impl Stream<Item = Result<Change, E>>
where
    S: Stream<Item = Result<Input, E>>,
{
    inputs.filter_map(move |input| {
        let out = match input {
            Ok(Input::Record(record)) => match writer.apply(record) {
                Outcome::Changed(change) => Some(Ok(change)),
                Outcome::Duplicate | Outcome::Stale | Outcome::Unknown => None,
            },
            Ok(Input::CaughtUp) => {
                writer.caught_up();
                Some(Ok(Change::CaughtUp))
            }
            Err(error) => Some(Err(error)),
        };
        future::ready(out)
    })
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
