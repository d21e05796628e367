package limit

import (
	"container/heap"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
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
	for _, sc := range []trafficScenario{
		{streams: 8, failRate: 0.1, budget: 1_000_000},
		{streams: 8, failRate: 0.1, zeroEnd: true, budget: 1_000_000},
		{streams: 64, failRate: 0.1, budget: 1_000_000},
		{streams: 64, failRate: 0.1, zeroEnd: true, budget: 1_000_000},
		{streams: 64, budget: 1_000_000},
		{streams: 256, budget: 1_000_000},
		{streams: 64, budget: 100_000},
		{streams: 64, budget: 1_000_000, scale: 10},
		{streams: 256, budget: 1_000_000, scale: 10},
		{streams: 8, failRate: 0.1, budget: 1_000_000, exact: true},
		{streams: 64, failRate: 0.1, budget: 1_000_000, exact: true},
	} {
		b.Run(sc.String(), func(b *testing.B) {
			var worstUsage, worstFalse float64
			for i := range b.N {
				usage, falsePct := sc.run(uint64(i%8 + *trafficSeed))
				worstUsage, worstFalse = max(worstUsage, usage), max(worstFalse, falsePct)
			}
			b.ReportMetric(worstUsage, "x_budget")
			b.ReportMetric(worstFalse, "%false")
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
	scale    int64 // streams this many times longer, the run too (0: 1)
}

func (sc trafficScenario) String() string {
	shape := "none"
	if sc.zeroEnd {
		shape = "zero"
	}
	pair := "envoy"
	if sc.exact {
		pair = "exact"
	}
	name := fmt.Sprintf("streams=%d/fail=%.0f%%/end=%s/budget=%d/pair=%s", sc.streams, 100*sc.failRate, shape, sc.budget, pair)
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

// run plays the scenario for 8 s (times its scale) from a window's start
// and returns the usage let through (x the budget) and the false refusals
// (% of checks).
func (sc trafficScenario) run(seed uint64) (usage, falsePct float64) {
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
	decide := func(now int64, hits uint64) bool {
		ch, sts := []Check{c}, []State{st}
		ch[0].Hits = hits
		ok := Decide(ch, sts, []bool{found}, now, make([]Result, 1), make([]int64, 1))
		st, found = sts[0], true
		return ok
	}
	var charged, inflight uint64
	var checks, falseRef int
	q := &trafficQueue{}
	for i := range sc.streams {
		heap.Push(q, trafficEvent{at: base + int64(rng.IntN(1000)), stream: i})
	}
	for q.Len() > 0 {
		e := heap.Pop(q).(trafficEvent)
		if !e.end {
			if e.at-base > length*scale {
				continue
			}
			size := uint64(1000 + rng.IntN(3001))
			dur := int64(20_000+rng.IntN(180_001)) * scale
			fail := rng.Float64() < sc.failRate
			held := st.Flights
			ok := decide(e.at+lat, 0)
			checks++
			if !ok {
				if charged+inflight+size <= sc.budget {
					falseRef++
				}
				heap.Push(q, trafficEvent{at: e.at + 2*lat + retry, stream: e.stream})
				continue
			}
			if sc.exact && fail {
				st.Flights = held // never in flight: its charge never comes
			}
			inflight += size
			heap.Push(q, trafficEvent{at: e.at + 2*lat + dur, stream: e.stream, end: true, size: size, fail: fail, admit: (e.at + lat) / 1000})
			continue
		}
		inflight -= e.size
		switch {
		case !e.fail:
			held := st.Flights
			decide(e.at+lat, e.size)
			if sc.exact {
				st.Flights = endOwn(held, e.admit)
			}
			charged += e.size
		case sc.zeroEnd && !sc.exact:
			decide(e.at+lat, 0) // alone in its request: a check
		}
		heap.Push(q, trafficEvent{at: e.at + 2*lat, stream: e.stream})
	}
	return float64(charged) / float64(sc.budget), 100 * float64(falseRef) / float64(max(checks, 1))
}

// endOwn ends the flight of the check admitted at admitMS, where the
// store has guessed (pair=exact).
func endOwn(fl []Flight, admitMS int64) []Flight {
	for i, f := range fl {
		if f.FirstMS <= admitMS && admitMS <= f.LastMS {
			out := slices.Clone(fl)
			if out[i].N > 1 {
				out[i].N--
				return out
			}
			return slices.Delete(out, i, i+1)
		}
	}
	return fl // expired already
}
