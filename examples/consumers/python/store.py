"""A store of the current objects, built from kube-event-bridge's events by the rules of
docs/consumers.md ("The rules for a consumer in any language"): state keyed by uid; per uid the
`sequence` of the last applied event (string order is numeric order); deletes never dropped for
their sequence, deleted uids remembered; a recreated name goes to the higher sequence; a
tombstone removes what its record key names."""

from dataclasses import dataclass, field


@dataclass
class Entry:
    uid: str
    namespace: str
    name: str
    resource_version: str
    sequence: str
    data: object


@dataclass
class Store:
    objects: dict = field(default_factory=dict)  # uid -> Entry
    names: dict = field(default_factory=dict)  # (namespace, name) -> uid
    deleted: set = field(default_factory=set)  # uids seen deleted
    applied: int = 0
    dropped: int = 0

    def apply(self, attributes, data):
        """Applies one event: `attributes` are its CloudEvents attributes and extensions,
        `data` its decoded data. Returns whether it changed the store."""
        if not str(attributes.get("type", "")).startswith("io.kubeeventbridge.object."):
            self.dropped += 1
            return False
        uid, sequence = attributes["uid"], attributes["sequence"]
        change = attributes["type"].rsplit(".", 1)[-1]
        if uid in self.deleted:
            self.dropped += 1
            return False
        if change == "deleted":
            self._remove(uid)
            self.deleted.add(uid)
            self.applied += 1
            return True
        held = self.objects.get(uid)
        if held is not None and sequence <= held.sequence:
            self.dropped += 1
            return False
        key = (attributes.get("namespace", ""), attributes["name"])
        other = self.names.get(key)
        if other is not None and other != uid:
            if self.objects[other].sequence > sequence:
                # A newer object holds the name: this one is already gone.
                self.deleted.add(uid)
                self.dropped += 1
                return False
            self._remove(other)
            self.deleted.add(other)
        self.objects[uid] = Entry(uid, key[0], key[1], attributes["resourceversion"], sequence, data)
        self.names[key] = uid
        self.applied += 1
        return True

    def tombstone(self, key, by_name):
        """A null-valued Kafka record: removes the object its key names (`namespace/name` with
        `key: namespacedName`, else the uid)."""
        if by_name:
            namespace, _, name = key.rpartition("/")
            uid = self.names.get((namespace, name))
        else:
            uid = key
        if uid is not None and uid in self.objects:
            self._remove(uid)
            self.deleted.add(uid)

    def _remove(self, uid):
        entry = self.objects.pop(uid, None)
        if entry is not None and self.names.get((entry.namespace, entry.name)) == uid:
            del self.names[(entry.namespace, entry.name)]

    def snapshot(self):
        """uid -> resourceVersion of every object held."""
        return {uid: e.resource_version for uid, e in self.objects.items()}
