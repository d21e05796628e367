package rlqs_test

import (
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/fielderr/fielderrtest"
	"github.com/ratelimitd/ratelimitd/internal/rlqs"
)

// TestValidate: the zero Options are valid; each bad field is refused by
// name.
func TestValidate(t *testing.T) {
	fielderrtest.Check(t, []fielderrtest.Refusal[rlqs.Options]{
		{Field: "MaxStreams", Options: rlqs.Options{MaxStreams: -1}},
		{Field: "MaxBuckets", Options: rlqs.Options{MaxBuckets: -1}},
		{Field: "Margin", Options: rlqs.Options{Margin: 2 * time.Minute}},
		{Field: "IdleAfter", Options: rlqs.Options{IdleAfter: time.Second}},
		{Field: "FailureTTL", Options: rlqs.Options{AllowTTL: -time.Second}},
	})
}
