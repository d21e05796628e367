package redisstore_test

import (
	"crypto/x509"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/fielderr/fielderrtest"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
)

// TestValidate: the zero Options are valid; each bad field is refused by
// name.
func TestValidate(t *testing.T) {
	fielderrtest.Check(t, []fielderrtest.Refusal[redisstore.Options]{
		{Field: "Mode", Options: redisstore.Options{Mode: "ring"}},
		{Field: "Timeout", Options: redisstore.Options{Timeout: -time.Second}},
		{Field: "BreakerOpenAfter", Options: redisstore.Options{BreakerOpenAfter: -time.Second}},
		{Field: "JournalBytes", Options: redisstore.Options{JournalBytes: -1}},
		{Field: "URL", Options: redisstore.Options{URL: "redis://h:1", RootCAs: func() *x509.CertPool { return nil }}},
	})
}
