// Command natsstore reads a JetStream stream kube-event-bridge writes, from its start to where it
// ended when reading began, keeps a store of the current objects by the rules of
// docs/consumers.md ("The rules for a consumer in any language"), and prints the objects it
// holds as JSON: {"objects": {uid: resourceVersion}, "applied": n, "dropped": n}.
//
//	natsstore NATS_URL STREAM
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"kube-event-bridge.dev/examples/consumers/store"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: natsstore NATS_URL STREAM")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2]); err != nil {
		fmt.Fprintln(os.Stderr, "natsstore:", err)
		os.Exit(1)
	}
}

func run(server, stream string) error {
	nc, err := nats.Connect(server)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return err
	}
	// Where the stream ends now: read until that sequence.
	last := info.State.LastSeq
	held := store.New()
	if last > 0 {
		consumer, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
		if err != nil {
			return err
		}
		for {
			msg, err := consumer.Next(jetstream.FetchMaxWait(10 * time.Second))
			if err != nil {
				return fmt.Errorf("reading up to sequence %d: %w", last, err)
			}
			if err := applyMessage(held, msg.Headers()); err != nil {
				return err
			}
			meta, err := msg.Metadata()
			if err != nil {
				return err
			}
			if meta.Sequence.Stream >= last {
				break
			}
		}
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]any{
		"objects": held.Snapshot(), "applied": held.Applied, "dropped": held.Dropped,
	})
}

// applyMessage applies one message in binary mode: attributes in `ce-*` headers, percent-encoded.
func applyMessage(s *store.Store, headers nats.Header) error {
	attributes := map[string]string{}
	for name, values := range headers {
		lower := strings.ToLower(name)
		if !strings.HasPrefix(lower, "ce-") || len(values) == 0 {
			continue
		}
		value, err := url.PathUnescape(values[0])
		if err != nil {
			return fmt.Errorf("header %s: %w", name, err)
		}
		attributes[lower[3:]] = value
	}
	s.Apply(attributes)
	return nil
}
