"""Unit tests of store.py: the event contract's rules, without a broker."""

import unittest

from store import Store


def event(change, uid, rv, name="a", namespace="ns"):
    return {
        "type": f"io.kubeeventbridge.object.{change}",
        "uid": uid,
        "resourceversion": str(rv),
        "sequence": str(rv).zfill(20),
        "name": name,
        "namespace": namespace,
    }


class StoreTest(unittest.TestCase):
    def test_duplicates_and_stale_versions_are_dropped(self):
        s = Store()
        self.assertTrue(s.apply(event("added", "u1", 5), {}))
        self.assertTrue(s.apply(event("modified", "u1", 9), {}))
        self.assertFalse(s.apply(event("modified", "u1", 9), {}), "a duplicate")
        self.assertFalse(s.apply(event("modified", "u1", 7), {}), "stale")
        self.assertEqual(s.snapshot(), {"u1": "9"})

    def test_a_delete_is_never_dropped_for_its_sequence_and_the_uid_stays_deleted(self):
        s = Store()
        s.apply(event("added", "u1", 5), {})
        s.apply(event("modified", "u1", 9), {})
        self.assertTrue(s.apply(event("deleted", "u1", 5), {}), "a repaired delete may carry an older version")
        self.assertFalse(s.apply(event("modified", "u1", 12), {}), "late events of a deleted uid")
        self.assertEqual(s.snapshot(), {})

    def test_a_recreated_name_goes_to_the_newer_uid(self):
        s = Store()
        s.apply(event("added", "old", 5), {})
        s.apply(event("added", "new", 11), {})
        self.assertEqual(s.snapshot(), {"new": "11"})
        self.assertFalse(s.apply(event("modified", "old", 7), {}), "the old uid is gone")
        s.apply(event("deleted", "old", 5), {})
        self.assertEqual(s.snapshot(), {"new": "11"})

    def test_the_newer_uid_keeps_the_name_when_the_older_arrives_later(self):
        s = Store()
        s.apply(event("added", "new", 11), {})
        self.assertFalse(s.apply(event("added", "old", 5), {}))
        self.assertEqual(s.snapshot(), {"new": "11"})

    def test_a_tombstone_removes_what_its_key_names(self):
        s = Store()
        s.apply(event("added", "u1", 5, name="a"), {})
        s.tombstone("ns/a", by_name=True)
        self.assertEqual(s.snapshot(), {})
        s.apply(event("added", "u2", 6, name="b"), {})
        s.tombstone("u2", by_name=False)
        self.assertEqual(s.snapshot(), {})

    def test_other_event_types_are_ignored(self):
        s = Store()
        self.assertFalse(s.apply({"type": "io.kubeeventbridge.heartbeat"}, {}))


if __name__ == "__main__":
    unittest.main()
