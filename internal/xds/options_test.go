package xds_test

import (
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/fielderr/fielderrtest"
	"github.com/ratelimitd/ratelimitd/internal/xds"
)

// TestValidate: the zero Options are valid; each bad field is refused by
// name.
func TestValidate(t *testing.T) {
	fielderrtest.Check(t, []fielderrtest.Refusal[xds.Options]{
		{Field: "MaxMessage", Options: xds.Options{MaxMessage: 100}},
		{Field: "BackoffInitial", Options: xds.Options{BackoffInitial: -time.Second}},
		{Field: "BackoffMax", Options: xds.Options{BackoffInitial: time.Minute, BackoffMax: time.Second}},
	})
}
