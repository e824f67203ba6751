// Command otlp-receiver is the OpenTelemetry Collector's OTLP receiver (gRPC and HTTP) built
// alone for the test environment: it writes every batch of spans it receives to a file, one
// OTLP/JSON document a line, so tests can read what the bridge exported.
package main

import (
	"context"
	"flag"
	"log"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"go.uber.org/zap"
)

// host is the receiver's host: no extensions.
type host struct{}

func (host) GetExtensions() map[component.ID]component.Component { return nil }

// lines appends one JSON document a line to a file; batches arrive concurrently.
type lines struct {
	mu   sync.Mutex
	file *os.File
	json ptrace.JSONMarshaler
}

func (l *lines) consume(_ context.Context, td ptrace.Traces) error {
	doc, err := l.json.MarshalTraces(td)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, err = l.file.Write(append(doc, '\n'))
	return err
}

func main() {
	grpcAddr := flag.String("grpc", "127.0.0.1:4317", "OTLP/gRPC listen address")
	httpAddr := flag.String("http", "127.0.0.1:4318", "OTLP/HTTP listen address")
	out := flag.String("out", "traces.jsonl", "file the spans are appended to")
	flag.Parse()

	file, err := os.OpenFile(*out, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		log.Fatalf("open %s: %v", *out, err)
	}
	sink := &lines{file: file}
	traces, err := consumer.NewTraces(sink.consume)
	if err != nil {
		log.Fatal(err)
	}

	factory := otlpreceiver.NewFactory()
	cfg := factory.CreateDefaultConfig()
	protocols := map[string]any{"protocols": map[string]any{
		"grpc": map[string]any{"endpoint": *grpcAddr},
		"http": map[string]any{"endpoint": *httpAddr},
	}}
	if err := confmap.NewFromStringMap(protocols).Unmarshal(cfg); err != nil {
		log.Fatalf("receiver config: %v", err)
	}
	settings := receiver.Settings{
		ID: component.MustNewID("otlp"),
		TelemetrySettings: component.TelemetrySettings{
			Logger:         zap.NewNop(),
			TracerProvider: tracenoop.NewTracerProvider(),
			MeterProvider:  metricnoop.NewMeterProvider(),
			Resource:       pcommon.NewResource(),
		},
		BuildInfo: component.NewDefaultBuildInfo(),
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	rcv, err := factory.CreateTraces(ctx, settings, cfg, traces)
	if err != nil {
		log.Fatalf("create receiver: %v", err)
	}
	if err := rcv.Start(ctx, host{}); err != nil {
		log.Fatalf("start receiver: %v", err)
	}
	log.Printf("receiving OTLP on grpc %s and http %s, writing %s", *grpcAddr, *httpAddr, *out)
	<-ctx.Done()
	if err := rcv.Shutdown(context.Background()); err != nil {
		log.Printf("shutdown: %v", err)
	}
}
