package store

import (
	"fmt"
	"reflect"
	"testing"
)

func event(change, uid string, rv int, name string) map[string]string {
	return map[string]string{
		"type": "io.kubeeventbridge.object." + change, "uid": uid,
		"resourceversion": fmt.Sprint(rv), "sequence": fmt.Sprintf("%020d", rv),
		"name": name, "namespace": "ns",
	}
}

func TestDuplicatesStaleVersionsDeletesAndRecreatedNames(t *testing.T) {
	s := New()
	s.Apply(event("added", "u1", 5, "a"))
	s.Apply(event("modified", "u1", 9, "a"))
	if s.Apply(event("modified", "u1", 9, "a")) || s.Apply(event("modified", "u1", 7, "a")) {
		t.Fatal("a duplicate or a stale version was applied")
	}
	if !s.Apply(event("deleted", "u1", 5, "a")) {
		t.Fatal("a repaired delete carrying an older version was dropped")
	}
	if s.Apply(event("modified", "u1", 12, "a")) {
		t.Fatal("an event of a deleted uid was applied")
	}
	s.Apply(event("added", "old", 20, "b"))
	s.Apply(event("added", "new", 30, "b"))
	if s.Apply(event("modified", "old", 25, "b")) {
		t.Fatal("the replaced uid came back")
	}
	if got := s.Snapshot(); !reflect.DeepEqual(got, map[string]string{"new": "30"}) {
		t.Fatalf("store %v", got)
	}
}

func TestATombstoneRemovesWhatItsKeyNames(t *testing.T) {
	s := New()
	s.Apply(event("added", "u1", 5, "a"))
	s.Apply(event("added", "u2", 6, "b"))
	s.Tombstone("u1", false)
	s.Tombstone("ns/b", true)
	s.Tombstone("ns/missing", true)
	if got := s.Snapshot(); len(got) != 0 {
		t.Fatalf("held %v", got)
	}
	if s.Apply(event("modified", "u1", 9, "a")) {
		t.Fatal("a uid removed by its tombstone came back")
	}
}
