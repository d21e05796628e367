package service

import (
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// The header names envoyproxy/ratelimit uses by default.
const (
	HeaderLimit     = "RateLimit-Limit"
	HeaderRemaining = "RateLimit-Remaining"
	HeaderReset     = "RateLimit-Reset"
)

// headers describes the most constraining decided descriptor: the first
// one over its limit (quota-mode ones aside), else the one with the
// fewest remaining, the first on a tie. Descriptors answered by failure
// policy are left out: nothing is known of them.
func headers(items []item, statuses []*rlsv3.RateLimitResponse_DescriptorStatus, states []checkState) []*corev3.HeaderValue {
	best := -1
	for i, st := range statuses {
		if st.GetCurrentLimit() == nil || states[items[i].check].failed {
			continue
		}
		if st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT && !items[i].quota {
			best = i
			break
		}
		if best < 0 || st.GetLimitRemaining() < statuses[best].GetLimitRemaining() {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	st := statuses[best]
	return []*corev3.HeaderValue{
		{Key: HeaderLimit, Value: strconv.FormatUint(uint64(st.GetCurrentLimit().GetRequestsPerUnit()), 10)},
		{Key: HeaderRemaining, Value: strconv.FormatUint(uint64(st.GetLimitRemaining()), 10)},
		{Key: HeaderReset, Value: strconv.FormatInt(st.GetDurationUntilReset().GetSeconds(), 10)},
	}
}
