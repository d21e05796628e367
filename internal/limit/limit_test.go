package limit

import "testing"

func TestApplyAllOrNothing(t *testing.T) {
	checks := []Check{
		{Key: "a", Limit: 10, Hits: 1},
		{Key: "b", Limit: 2, Hits: 1},
		{Key: "c", Limit: 5, Hits: 3, Refund: true},
	}
	counts := []uint64{4, 2, 1}
	res := make([]Result, 3)
	if Apply(checks, counts, res) {
		t.Fatal("admitted, want rejected by b")
	}
	if counts[0] != 4 || counts[1] != 2 || counts[2] != 0 {
		t.Errorf("counts = %v, want [4 2 0]: no consumption, refund floored at 0", counts)
	}
	if res[0].Over || !res[1].Over || res[2].Over {
		t.Errorf("over = %v %v %v", res[0].Over, res[1].Over, res[2].Over)
	}
	checks[1].NoVeto = true
	counts = []uint64{4, 2, 4}
	if !Apply(checks, counts, res) {
		t.Fatal("rejected by a shadow counter")
	}
	if counts[0] != 5 || counts[1] != 2 || counts[2] != 1 {
		t.Errorf("counts = %v, want [5 2 1]", counts)
	}
	if got := res[0].Remaining(10); got != 5 {
		t.Errorf("remaining = %d", got)
	}
}

func TestApplyPeek(t *testing.T) {
	checks := []Check{{Limit: 3, Hits: 0}}
	counts := []uint64{3}
	res := make([]Result, 1)
	if !Apply(checks, counts, res) || res[0].Over || counts[0] != 3 {
		t.Errorf("peek at the limit: over=%v count=%d, want OK and unchanged", res[0].Over, counts[0])
	}
}

func TestWindowEnd(t *testing.T) {
	if got := WindowEnd(61e6+5, 60e6); got != 120e6 {
		t.Errorf("WindowEnd = %d", got)
	}
	if got := WindowEnd(60e6, 60e6); got != 120e6 {
		t.Errorf("WindowEnd at boundary = %d", got)
	}
}
