package tracing_test

import (
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/options/optionstest"
	"github.com/ratelimitd/ratelimitd/internal/tracing"
)

// TestValidate: the zero Options are valid; each bad field is refused by
// name.
func TestValidate(t *testing.T) {
	optionstest.Check(t, []optionstest.Refusal[tracing.Options]{
		{Field: "Protocol", Options: tracing.Options{Protocol: "udp"}},
		{Field: "SamplingRate", Options: tracing.Options{SamplingRate: 1.5}},
		{Field: "SamplingRate", Options: tracing.Options{SamplingRate: -0.1}},
	})
}
