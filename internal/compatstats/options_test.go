package compatstats_test

import (
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/compatstats"
	"github.com/ratelimitd/ratelimitd/internal/options/optionstest"
)

// TestValidate: the zero Options are valid; each bad field is refused by
// name.
func TestValidate(t *testing.T) {
	optionstest.Check(t, []optionstest.Refusal[compatstats.Options]{
		{Field: "StatsdProtocol", Options: compatstats.Options{StatsdProtocol: "sctp"}},
		{Field: "DogStatsd", Options: compatstats.Options{DogStatsd: true}},
		{Field: "FlushInterval", Options: compatstats.Options{FlushInterval: -time.Second}},
		{Field: "NearLimitRatio", Options: compatstats.Options{NearLimitRatio: 1.5}},
	})
}
