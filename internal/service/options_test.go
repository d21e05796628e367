package service_test

import (
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/fielderr/fielderrtest"
	"github.com/ratelimitd/ratelimitd/internal/service"
)

// TestValidate: the zero Options are valid; each bad field is refused by
// name.
func TestValidate(t *testing.T) {
	fielderrtest.Check(t, []fielderrtest.Refusal[service.Options]{
		{Field: "HeaderNames.Limit", Options: service.Options{HeaderNames: service.HeaderNames{Limit: "bad header"}}},
		{Field: "NearLimitRatio", Options: service.Options{NearLimitRatio: 2}},
		{Field: "UsageTimeout", Options: service.Options{UsageTimeout: 1500 * time.Millisecond}},
		{Field: "DeadlineMargin", Options: service.Options{DeadlineMargin: -time.Millisecond}},
	})
}
