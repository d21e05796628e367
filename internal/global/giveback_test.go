package global_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/global"
	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

// answerLost is a home whose give-backs run but whose answers are lost,
// as when a link fails after the call reached the home.
type answerLost struct{ *redisstore.Store }

func (h answerLost) GrantWithin(ctx context.Context, ops []limit.GrantOp) ([]limit.GrantResult, error) {
	out, err := h.Store.GrantWithin(ctx, ops)
	for _, op := range ops {
		if op.GiveBack && err == nil {
			return nil, errors.New("the answer was lost")
		}
	}
	return out, err
}

// TestLostGiveBackNotRepeated: a give-back whose answer is lost may have
// run; made again, the hits would go back twice and the home would grant
// them twice, over the limit. An instance that went idle holding hits
// gives them back once, and the home's count keeps the hit it spent.
func TestLostGiveBackNotRepeated(t *testing.T) {
	srv := redistest.Start(t)
	home, err := redisstore.New(redisstore.Options{URL: srv.URL(), Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer home.Close()
	local, err := redisstore.New(redisstore.Options{URL: redistest.Start(t).URL(), Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	g := global.New(local, answerLost{home}, global.Options{Refresh: 20 * time.Millisecond})
	defer g.Close()
	redistest.AwayFromHourEnd(30 * time.Second)
	c := limit.Check{Key: "g:lost", Limit: 1000, WindowUS: 3600e6, Hits: 1, Global: true}
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := g.Evaluate(context.Background(), []limit.Check{c})
		if err != nil {
			t.Fatal(err)
		}
		if !res[0].Over {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no grant within 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Idle for 5 s: what is held goes back; passes go on after it.
	time.Sleep(6 * time.Second)
	res, err := home.Evaluate(context.Background(), []limit.Check{{Key: c.Key, Limit: c.Limit, WindowUS: c.WindowUS}})
	if err != nil {
		t.Fatal(err)
	}
	if used := c.Limit - res[0].Remaining; used < 1 {
		t.Errorf("the home counts %d used after the give-back; want at least the 1 hit admitted: given back twice", used)
	}
}
