// Command kafkastore reads a topic kube-event-bridge writes, from its start to where it ended
// when reading began, with read_committed (franz-go), keeps a store of the current objects by the
// rules of docs/consumers.md ("The rules for a consumer in any language"), and prints the objects
// it holds as JSON: {"objects": {uid: resourceVersion}, "applied": n, "dropped": n}.
//
//	kafkastore BOOTSTRAP_SERVERS TOPIC [--by-name]
//
// --by-name: the topic is keyed by namespace/name (its tombstones name objects so).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"kube-event-bridge.dev/examples/consumers/store"
)

func main() {
	if len(os.Args) < 3 || len(os.Args) > 4 || (len(os.Args) == 4 && os.Args[3] != "--by-name") {
		fmt.Fprintln(os.Stderr, "usage: kafkastore BOOTSTRAP_SERVERS TOPIC [--by-name]")
		os.Exit(2)
	}
	if err := run(strings.Split(os.Args[1], ","), os.Args[2], len(os.Args) == 4); err != nil {
		fmt.Fprintln(os.Stderr, "kafkastore:", err)
		os.Exit(1)
	}
}

func run(brokers []string, topic string, byName bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ends, err := committedEnds(ctx, brokers, topic)
	if err != nil {
		return err
	}
	start := map[int32]kgo.Offset{}
	for p := range ends {
		start[p] = kgo.NewOffset().AtStart()
	}
	// Control records (transaction markers) are kept, so that the position reached is known even
	// where a partition ends with a marker.
	client, err := kgo.NewClient(kgo.SeedBrokers(brokers...),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords(),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: start}))
	if err != nil {
		return err
	}
	defer client.Close()
	held := store.New()
	pending := map[int32]int64{}
	for p, end := range ends {
		if end > 0 {
			pending[p] = end
		}
	}
	for len(pending) > 0 {
		fetches := client.PollFetches(ctx)
		if err := fetches.Err0(); err != nil {
			return fmt.Errorf("partitions %v not read to their end: %w", pending, err)
		}
		var failed error
		fetches.EachRecord(func(r *kgo.Record) {
			if failed == nil && !r.Attrs.IsControl() {
				failed = apply(held, r, byName)
			}
			if end, ok := pending[r.Partition]; ok && r.Offset+1 >= end {
				delete(pending, r.Partition)
			}
		})
		if failed != nil {
			return failed
		}
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]any{
		"objects": held.Snapshot(), "applied": held.Applied, "dropped": held.Dropped,
	})
}

// committedEnds gives where each partition of topic ends now for a read_committed reader (its
// last stable offset).
func committedEnds(ctx context.Context, brokers []string, topic string) (map[int32]int64, error) {
	client, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return nil, err
	}
	defer client.Close()
	listed, err := kadm.NewClient(client).ListCommittedOffsets(ctx, topic)
	if err != nil {
		return nil, err
	}
	ends := map[int32]int64{}
	listed.Each(func(o kadm.ListedOffset) { ends[o.Partition] = o.Offset })
	if len(ends) == 0 {
		return nil, fmt.Errorf("topic %s has no partitions", topic)
	}
	return ends, listed.Error()
}

// apply applies one record: a tombstone removes what its key names, any other record is an
// event in binary mode (attributes in `ce_*` headers, plain UTF-8) or structured mode (a JSON
// document).
func apply(s *store.Store, r *kgo.Record, byName bool) error {
	if r.Value == nil {
		s.Tombstone(string(r.Key), byName)
		return nil
	}
	attributes := map[string]string{}
	for _, h := range r.Headers {
		if name, ok := strings.CutPrefix(strings.ToLower(h.Key), "ce_"); ok {
			attributes[name] = string(h.Value)
		}
		if strings.EqualFold(h.Key, "content-type") && strings.HasPrefix(string(h.Value), "application/cloudevents+json") {
			return applyStructured(s, r.Value)
		}
	}
	s.Apply(attributes)
	return nil
}

// applyStructured applies one structured-mode event: its attributes are the document's string
// members.
func applyStructured(s *store.Store, document []byte) error {
	var members map[string]any
	if err := json.Unmarshal(document, &members); err != nil {
		return fmt.Errorf("structured event: %w", err)
	}
	attributes := map[string]string{}
	for name, value := range members {
		if text, ok := value.(string); ok {
			attributes[name] = text
		}
	}
	s.Apply(attributes)
	return nil
}
