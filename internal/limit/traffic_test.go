package limit

import (
	"container/heap"
	"flag"
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkBudgetTraffic runs Decide on the token budget's traffic as
// ratelimitd-bench -budget sends it (streams of 1,000-4,000 tokens over
// 20-200 ms, a check, the stream, a charge; a refused check retried
// after 50 ms; 1 ms each way to the store), in simulated time: 8 s of a
// scenario take milliseconds, so a change to the budget is measured on
// many seeds before the real benchmark (scripts/budget-bench.sh). It
// reports, over the seeds, the worst usage let through (x the budget)
// and the worst false refusals (% of checks refused although the budget,
// with every admitted stream's tokens charged, would have covered the
// stream, the load tool's definition). With pair=exact the store is told
// which check a charge ends and that a failed stream's check never
// charges: the bound with nothing to guess, for comparison.
//
//	go test -run XXX -bench BudgetTraffic ./internal/limit/
//
// The seeds are 1-8 (i%8 + 1); -traffic.seed N starts them at N instead,
// to see whether a change holds on other draws:
//
//	go test -run XXX -bench BudgetTraffic ./internal/limit/ -args -traffic.seed 9
func BenchmarkBudgetTraffic(b *testing.B) {
	var scenarios []trafficScenario
	for _, scale := range []int64{1, 10} {
		for _, streams := range []int{8, 64} {
			for _, zero := range []bool{false, true} {
				for _, pair := range []bool{false, true} {
					for _, sdk := range []bool{false, true} {
						scenarios = append(scenarios, trafficScenario{streams: streams, failRate: 0.1, zeroEnd: zero, budget: 1_000_000, scale: scale, pairID: pair, sdk: sdk})
					}
				}
			}
		}
	}
	scenarios = append(scenarios,
		trafficScenario{streams: 64, budget: 1_000_000},
		trafficScenario{streams: 256, budget: 1_000_000},
		trafficScenario{streams: 64, budget: 1_000_000, pairID: true},
		trafficScenario{streams: 256, budget: 1_000_000, pairID: true},
		trafficScenario{streams: 64, budget: 100_000},
		trafficScenario{streams: 64, budget: 100_000, pairID: true},
		trafficScenario{streams: 64, budget: 1_000_000, scale: 10},
		trafficScenario{streams: 256, budget: 1_000_000, scale: 10},
		trafficScenario{streams: 256, budget: 1_000_000, scale: 10, pairID: true},
		trafficScenario{streams: 8, failRate: 0.1, budget: 1_000_000, exact: true},
		trafficScenario{streams: 64, failRate: 0.1, budget: 1_000_000, exact: true},
	)
	for _, sc := range scenarios {
		b.Run(sc.String(), func(b *testing.B) {
			var worst trafficResult
			for i := range b.N {
				r := sc.run(uint64(i%8 + *trafficSeed))
				worst.usage, worst.falsePct = max(worst.usage, r.usage), max(worst.falsePct, r.falsePct)
				worst.blockedPerStream = max(worst.blockedPerStream, r.blockedPerStream)
				worst.longestBlock = max(worst.longestBlock, r.longestBlock)
				worst.gaveUp = max(worst.gaveUp, r.gaveUp)
				worst.horizon = max(worst.horizon, r.horizon)
			}
			b.ReportMetric(worst.usage, "x_budget")
			b.ReportMetric(worst.falsePct, "%false")
			b.ReportMetric(worst.blockedPerStream, "s_blocked/stream")
			b.ReportMetric(worst.longestBlock, "s_longest_block")
			b.ReportMetric(worst.horizon, "s_horizon")
			if sc.sdk {
				b.ReportMetric(float64(worst.gaveUp), "false_giveups")
			}
		})
	}
}

// trafficSeed is the first of BenchmarkBudgetTraffic's eight seeds.
var trafficSeed = flag.Int("traffic.seed", 1, "the first of BenchmarkBudgetTraffic's eight seeds")

type trafficScenario struct {
	streams  int
	failRate float64
	zeroEnd  bool // a failed stream ends with a call of 0 hits alone, else none
	budget   uint64
	exact    bool  // the store knows which check a charge ends
	pairID   bool  // each stream's calls carry its request id (Check.PairID)
	sdk      bool  // a refused request is retried as OpenAI's SDK does: after ~0.5 s, ~1 s, then given up
	scale    int64 // streams this many times longer, the run too (0: 1)
}

// trafficResult is what one run measured: the usage let through (x the
// budget), the false refusals (% of checks refused although the budget,
// with every admitted stream's tokens charged, would have covered the
// stream), the time streams were so refused (s, over the streams; a
// refusal counts until the stream's next call), the longest such block
// (s, from a false refusal to the next admission or true refusal), the
// requests an SDK client gave up on while the budget could cover them,
// and the horizon learned at the end (s).
type trafficResult struct {
	usage, falsePct, blockedPerStream, longestBlock, horizon float64
	gaveUp                                                   int
}

func (sc trafficScenario) String() string {
	shape := "none"
	if sc.zeroEnd {
		shape = "zero"
	}
	pair := "envoy"
	switch {
	case sc.exact:
		pair = "exact"
	case sc.pairID:
		pair = "request_id"
	}
	name := fmt.Sprintf("streams=%d/fail=%.0f%%/end=%s/budget=%d/pair=%s", sc.streams, 100*sc.failRate, shape, sc.budget, pair)
	if sc.sdk {
		name += "/retry=sdk"
	}
	if sc.scale > 1 {
		name += fmt.Sprintf("/longer=%dx", sc.scale)
	}
	return name
}

// trafficEvent is a stream's next call: a check, or its end.
type trafficEvent struct {
	at     int64 // µs
	stream int
	end    bool
	size   uint64
	fail   bool
	admit  int64 // ms: when its check went in flight
	id     int   // the request's id, for pairID
	tries  int   // sdk: the request's refusals so far
}

type trafficQueue []trafficEvent

func (q trafficQueue) Len() int           { return len(q) }
func (q trafficQueue) Less(i, j int) bool { return q[i].at < q[j].at }
func (q trafficQueue) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *trafficQueue) Push(x any)        { *q = append(*q, x.(trafficEvent)) }
func (q *trafficQueue) Pop() any {
	o := *q
	x := o[len(o)-1]
	*q = o[:len(o)-1]
	return x
}

// run plays the scenario for 8 s (times its scale) from a window's start.
func (sc trafficScenario) run(seed uint64) trafficResult {
	const (
		lat    = 1_000     // µs each way
		retry  = 50_000    // µs after a refusal
		length = 8_000_000 // µs of checks
		window = 3600_000_000
	)
	rng := rand.New(rand.NewPCG(seed, 7))
	scale := max(sc.scale, 1)
	base := int64(1_000_000 * window) // a window's start
	c := Check{Key: "k", Limit: sc.budget, WindowUS: window, Usage: true, FlightS: 300}
	st, found := State{}, false
	type pairState struct {
		ms   int64
		flew bool
	}
	pairs := map[int]pairState{}
	decide := func(now int64, hits uint64, id int) bool {
		ch, sts := []Check{c}, []State{st}
		ch[0].Hits = hits
		if sc.pairID {
			ch[0].PairID = fmt.Sprint(id)
			p := pairs[id]
			sts[0].PairMS, sts[0].PairFlew = p.ms, p.flew
		}
		ok := Decide(ch, sts, []bool{found}, now, make([]Result, 1), make([]int64, 1))
		if sc.pairID {
			if sts[0].PairMS > 0 {
				pairs[id] = pairState{sts[0].PairMS, sts[0].PairFlew}
			} else {
				delete(pairs, id)
			}
			sts[0].PairMS, sts[0].PairFlew = 0, false
		}
		st, found = sts[0], true
		return ok
	}
	var charged, inflight uint64
	var checks, falseRef, gaveUp, nextID int
	var blocked, longest int64
	blockSince := make([]int64, sc.streams) // µs: a false block's start, or 0
	q := &trafficQueue{}
	for i := range sc.streams {
		heap.Push(q, trafficEvent{at: base + int64(rng.IntN(1000)), stream: i})
	}
	endBlock := func(i int, at int64) {
		if blockSince[i] > 0 {
			longest = max(longest, at-blockSince[i])
			blockSince[i] = 0
		}
	}
	for q.Len() > 0 {
		e := heap.Pop(q).(trafficEvent)
		if !e.end {
			if e.at-base > length*scale {
				endBlock(e.stream, e.at)
				continue
			}
			size := uint64(1000 + rng.IntN(3001))
			dur := int64(20_000+rng.IntN(180_001)) * scale
			fail := rng.Float64() < sc.failRate
			held := st.Flights
			nextID++
			ok := decide(e.at+lat, 0, nextID)
			checks++
			if !ok {
				wait := int64(retry)
				if sc.sdk {
					// OpenAI's SDK: 0.5 s, then 1 s, less up to a quarter
					// of jitter; then the request is given up.
					wait = int64(500_000<<e.tries) - rng.Int64N(125_000<<e.tries)
				}
				covered := charged+inflight+size <= sc.budget
				if covered {
					falseRef++
					blocked += 2*lat + wait
					if blockSince[e.stream] == 0 {
						blockSince[e.stream] = e.at
					}
				} else {
					endBlock(e.stream, e.at)
				}
				next := trafficEvent{at: e.at + 2*lat + wait, stream: e.stream, tries: e.tries + 1}
				if sc.sdk && e.tries == 2 {
					if covered {
						gaveUp++
					}
					next.tries = 0
				}
				heap.Push(q, next)
				continue
			}
			endBlock(e.stream, e.at)
			if sc.exact && fail {
				st.Flights = held // never in flight: its charge never comes
			}
			inflight += size
			heap.Push(q, trafficEvent{at: e.at + 2*lat + dur, stream: e.stream, end: true, size: size, fail: fail, admit: (e.at + lat) / 1000, id: nextID})
			continue
		}
		inflight -= e.size
		switch {
		case !e.fail:
			held := st.Flights
			decide(e.at+lat, e.size, e.id)
			if sc.exact {
				st.Flights = endAt(held, e.admit)
			}
			charged += e.size
		case sc.zeroEnd && !sc.exact:
			decide(e.at+lat, 0, e.id) // alone in its request
		}
		heap.Push(q, trafficEvent{at: e.at + 2*lat, stream: e.stream})
	}
	return trafficResult{
		usage:            float64(charged) / float64(sc.budget),
		falsePct:         100 * float64(falseRef) / float64(max(checks, 1)),
		blockedPerStream: float64(blocked) / 1e6 / float64(sc.streams),
		longestBlock:     float64(longest) / 1e6,
		horizon:          float64(FlightMS(&c, &st)) / 1000,
		gaveUp:           gaveUp,
	}
}
