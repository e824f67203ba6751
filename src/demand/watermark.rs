//! The decision a snapshot's listed object gets against the stream, without I/O.
//!
//! An object listed at resourceVersion `r` (its last write when it was read) is compared with
//! the pipeline's position `P` (the resourceVersion the watch has delivered up to) and with the
//! version the known-object index holds for its uid:
//!
//! - `P < r`, or a relist in progress: **hold**. The watch has not delivered the write `r` yet;
//!   its older live events may still come, and must not follow the newer state.
//! - the index holds `r`: **emit**. Nothing newer was published; the snapshot repeats the
//!   current state.
//! - the index holds another version, or nothing: **skip**. The object changed or was deleted
//!   after it was read, and that newer state was published after the begin marker (the walk
//!   reads only after the begin marker is acknowledged, so every write newer than what it read
//!   comes later in the stream).
//!
//! Opaque (non-numeric) resourceVersions cannot be ordered: such an object is never held, and
//! is emitted only while the index holds its version.

/// What to do with one listed object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Publish it as part of the snapshot.
    Emit,
    /// Wait until the stream has reached its version.
    Hold,
    /// Leave it out: a newer state or its delete was published since it was read.
    Skip,
}

/// The decision for an object listed at `listed`, with the stream at `position` (`None`: no
/// position yet), `relisting` when the watch is in the middle of a (re)list, and `known` the
/// version the index holds for the object's uid.
pub fn decide(
    listed: &str,
    position: Option<&str>,
    relisting: bool,
    known: Option<&str>,
) -> Decision {
    if relisting {
        return Decision::Hold;
    }
    if let Ok(r) = listed.parse::<u64>() {
        match position.map(str::parse::<u64>) {
            None => return Decision::Hold,
            Some(Ok(p)) if p < r => return Decision::Hold,
            _ => {}
        }
    }
    if known == Some(listed) {
        Decision::Emit
    } else {
        Decision::Skip
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_the_stream_has_not_reached_waits() {
        assert_eq!(decide("12", Some("11"), false, Some("9")), Decision::Hold);
        assert_eq!(decide("12", Some("11"), false, None), Decision::Hold);
        assert_eq!(decide("12", None, false, None), Decision::Hold);
    }

    #[test]
    fn a_relist_in_progress_holds_everything() {
        assert_eq!(decide("5", Some("20"), true, Some("5")), Decision::Hold);
    }

    #[test]
    fn the_current_state_is_emitted() {
        assert_eq!(decide("12", Some("12"), false, Some("12")), Decision::Emit);
        assert_eq!(decide("7", Some("40"), false, Some("7")), Decision::Emit);
    }

    #[test]
    fn a_newer_state_or_a_delete_published_since_skips_it() {
        assert_eq!(decide("7", Some("40"), false, Some("31")), Decision::Skip);
        assert_eq!(decide("7", Some("40"), false, None), Decision::Skip);
    }

    #[test]
    fn opaque_versions_are_never_held_and_emitted_only_while_current() {
        assert_eq!(decide("abc", Some("1"), false, Some("abc")), Decision::Emit);
        assert_eq!(decide("abc", None, false, Some("abd")), Decision::Skip);
    }
}
