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
