package service_test

import (
	"context"
	"testing"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/plan"
	"github.com/ratelimitd/ratelimitd/internal/service"
)

// granter is a store that also takes grants (memstore, redisstore).
type granter interface {
	service.Store
	Grant(ctx context.Context, ops []limit.GrantOp) ([]limit.GrantResult, error)
}

// TestPlanBucket: a bucket's plan names the very counter ShouldRateLimit
// decides the same descriptor on, so grants and requests share it.
func TestPlanBucket(t *testing.T) {
	forEachStore(t, func(t *testing.T, st service.Store) {
		s := service.New(rules(t), st, nil, service.Options{FailureMode: config.FailureDeny})
		for _, kv := range [][]string{{"user", "u1"}, {"files", "a/1"}, {"parent", "p", "child", "c"}} {
			p, err := s.PlanBucket("web", desc(kv...).Entries)
			if err != nil || p.Kind != plan.Counted {
				t.Fatalf("%v: plan %+v, %v", kv, p, err)
			}
			take := p.Check
			take.Hits = 1
			r, err := st.(granter).Grant(context.Background(), []limit.GrantOp{{Check: take}})
			if err != nil || r[0].Hits != 1 {
				t.Fatalf("%v: grant %+v, %v", kv, r, err)
			}
			resp := call(t, s, request(desc(kv...)))
			if got, want := resp.GetStatuses()[0].GetLimitRemaining(), uint32(p.Check.Limit-2); got != want {
				t.Errorf("%v: remaining after a grant of 1 and a request = %d, want %d", kv, got, want)
			}
		}
		if p, _ := s.PlanBucket("web", desc("files", "a/2").Entries); p.Check.Key == "" {
			t.Error("share_threshold bucket has no key")
		} else if q, _ := s.PlanBucket("web", desc("files", "a/1").Entries); p.Check.Key != q.Check.Key {
			t.Errorf("share_threshold values keyed apart: %q, %q", p.Check.Key, q.Check.Key)
		}
		for _, tt := range []struct {
			domain string
			kv     []string
			want   plan.Kind
		}{
			{"web", []string{"unl", "x"}, plan.Unlimited},
			{"web", []string{"shadow", "x"}, plan.Shadow},
			{"web", []string{"whitelisted", "me"}, plan.NoRule},
			{"web", []string{"nomatch", "x"}, plan.NoRule},
			{"nodomain", []string{"user", "x"}, plan.NoRule},
		} {
			if p, _ := s.PlanBucket(tt.domain, desc(tt.kv...).Entries); p.Kind != tt.want {
				t.Errorf("%s %v: kind %v, want %v", tt.domain, tt.kv, p.Kind, tt.want)
			}
		}
		if p, _ := s.PlanBucket("web", desc("browse", "x").Entries); p.Failure != config.FailureAllow {
			t.Errorf("browse failure = %v, want the rule's allow", p.Failure)
		}
		if p, _ := s.PlanBucket("web", desc("user", "x").Entries); p.Failure != config.FailureDeny {
			t.Errorf("user failure = %v, want the service's deny", p.Failure)
		}
	})
	shadow := service.New(rules(t), nil, nil, service.Options{ShadowMode: true})
	if p, _ := shadow.PlanBucket("web", desc("user", "x").Entries); p.Kind != plan.Shadow {
		t.Errorf("--shadow-mode: kind %v, want shadow", p.Kind)
	}
	if _, err := service.New(nil, nil, nil, service.Options{}).PlanBucket("web", nil); err != service.ErrNoRules {
		t.Errorf("no rules: %v, want ErrNoRules", err)
	}
}
