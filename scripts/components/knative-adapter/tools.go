//go:build tools

// Package tools pins Knative Eventing's ApiServerSource receive adapter, the peer that
// `scripts/bench peers` measures beside the bridge. It is built with
// `go build knative.dev/eventing/cmd/apiserver_receive_adapter` from this module.
package tools

import _ "knative.dev/eventing/cmd/apiserver_receive_adapter"
