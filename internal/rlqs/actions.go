package rlqs

import (
	"math"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// assign returns the action putting strategy in force on b for ttl.
func (ss *Session) assign(b *bucket, strategy *typev3.RateLimitStrategy, ttl time.Duration, kind sent) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	b.sent, b.foreign = kind, false
	if kind != sentTokens {
		b.granted, b.used, b.spent = 0, 0, 0
	}
	ss.srv.m.RLQSAssignment(kind.String())
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: b.id,
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: durationpb.New(ttl.Truncate(time.Second)),
				RateLimitStrategy:    strategy,
			}}}
}

func allowAll() *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_ALLOW_ALL}}
}

func denyAll() *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}}
}

// tokens is a token bucket holding exactly hits, refilling one token per
// TTL and a second: less than one over the assignment's life, which the
// bucket can never spend.
func tokens(hits uint64, ttl time.Duration) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens:     uint32(min(hits, math.MaxUint32)),
		TokensPerFill: wrapperspb.UInt32(1),
		FillInterval:  durationpb.New(ttl.Truncate(time.Second) + time.Second),
	}}}
}
