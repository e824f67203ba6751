// Package store keeps the current objects from kube-event-bridge's events by the rules of
// docs/consumers.md ("The rules for a consumer in any language").
package store

import "strings"

// Entry is what the store holds of one object.
type Entry struct {
	UID, Namespace, Name, ResourceVersion, Sequence string
}

type key struct{ namespace, name string }

// Store keeps the current objects: keyed by uid, the sequence of the last applied event per uid
// (string order is numeric order), deletes never dropped for their sequence, deleted uids
// remembered, a name held by the object with the higher sequence.
type Store struct {
	objects          map[string]Entry
	names            map[key]string
	deleted          map[string]bool
	Applied, Dropped int
}

// New returns an empty store.
func New() *Store {
	return &Store{objects: map[string]Entry{}, names: map[key]string{}, deleted: map[string]bool{}}
}

// Apply applies one event given its attributes; it reports whether the store changed.
func (s *Store) Apply(a map[string]string) bool {
	if !strings.HasPrefix(a["type"], "io.kubeeventbridge.object.") {
		s.Dropped++
		return false
	}
	uid, sequence := a["uid"], a["sequence"]
	change := a["type"][strings.LastIndex(a["type"], ".")+1:]
	if s.deleted[uid] {
		s.Dropped++
		return false
	}
	if change == "deleted" {
		s.remove(uid)
		s.deleted[uid] = true
		s.Applied++
		return true
	}
	if held, ok := s.objects[uid]; ok && sequence <= held.Sequence {
		s.Dropped++
		return false
	}
	k := key{a["namespace"], a["name"]}
	if other, ok := s.names[k]; ok && other != uid {
		if s.objects[other].Sequence > sequence {
			s.deleted[uid] = true
			s.Dropped++
			return false
		}
		s.remove(other)
		s.deleted[other] = true
	}
	s.objects[uid] = Entry{uid, k.namespace, k.name, a["resourceversion"], sequence}
	s.names[k] = uid
	s.Applied++
	return true
}

func (s *Store) remove(uid string) {
	e, ok := s.objects[uid]
	if !ok {
		return
	}
	delete(s.objects, uid)
	if s.names[key{e.Namespace, e.Name}] == uid {
		delete(s.names, key{e.Namespace, e.Name})
	}
}

// Tombstone applies a null-valued Kafka record: it removes the object its key names
// (namespace/name when the topic is keyed by name, else the uid).
func (s *Store) Tombstone(recordKey string, byName bool) {
	uid := recordKey
	if byName {
		i := strings.LastIndex(recordKey, "/")
		uid = s.names[key{recordKey[:max(i, 0)], recordKey[i+1:]}]
	}
	if _, ok := s.objects[uid]; ok {
		s.remove(uid)
		s.deleted[uid] = true
	}
}

// Snapshot returns uid -> resourceVersion of every object held.
func (s *Store) Snapshot() map[string]string {
	out := make(map[string]string, len(s.objects))
	for uid, e := range s.objects {
		out[uid] = e.ResourceVersion
	}
	return out
}
