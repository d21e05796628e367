package tracing_test

import (
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/fielderr/fielderrtest"
	"github.com/ratelimitd/ratelimitd/internal/tracing"
)

// TestValidate: the zero Options are valid; each bad field is refused by
// name.
func TestValidate(t *testing.T) {
	fielderrtest.Check(t, []fielderrtest.Refusal[tracing.Options]{
		{Field: "Protocol", Options: tracing.Options{Protocol: "udp"}},
		{Field: "SamplingRate", Options: tracing.Options{SamplingRate: 1.5}},
		{Field: "SamplingRate", Options: tracing.Options{SamplingRate: -0.1}},
	})
}
