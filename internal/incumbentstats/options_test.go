package incumbentstats_test

import (
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/fielderr/fielderrtest"
	"github.com/ratelimitd/ratelimitd/internal/incumbentstats"
)

// TestValidate: the zero Options are valid; each bad field is refused by
// name.
func TestValidate(t *testing.T) {
	fielderrtest.Check(t, []fielderrtest.Refusal[incumbentstats.Options]{
		{Field: "StatsdProtocol", Options: incumbentstats.Options{StatsdProtocol: "sctp"}},
		{Field: "DogStatsd", Options: incumbentstats.Options{DogStatsd: true}},
		{Field: "FlushInterval", Options: incumbentstats.Options{FlushInterval: -time.Second}},
		{Field: "NearLimitRatio", Options: incumbentstats.Options{NearLimitRatio: 1.5}},
	})
}
