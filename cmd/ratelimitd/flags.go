package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/envcompat"
	"github.com/ratelimitd/ratelimitd/internal/service"
)

// The flag types: each refuses at Set what no value of its flag can be, so
// that the bounds hold (and are tested) without starting a server.

// byteSize is a byte count with an optional KiB, MiB or GiB suffix.
type byteSize int

func (b *byteSize) String() string { return strconv.Itoa(int(*b)) }

func (b *byteSize) Set(s string) error {
	mult := 1
	num := strings.TrimSpace(s)
	for _, u := range []struct {
		suffix string
		mult   int
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if v, ok := strings.CutSuffix(num, u.suffix); ok {
			num, mult = strings.TrimSpace(v), u.mult
			break
		}
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 0 || n > (1<<40)/mult {
		return fmt.Errorf("want a byte count such as 0, 1048576 or 64MiB, got %q", s)
	}
	*b = byteSize(n * mult)
	return nil
}

// headersFlag is the header style. A bare --response-headers means legacy,
// as does true; false means off.
type headersFlag service.HeaderStyle

func (h *headersFlag) String() string {
	switch service.HeaderStyle(*h) {
	case service.HeadersLegacy:
		return "legacy"
	case service.HeadersDraft11:
		return "draft11"
	}
	return "off"
}

func (h *headersFlag) IsBoolFlag() bool { return true }

func (h *headersFlag) Set(s string) error {
	switch strings.ToLower(s) {
	case "legacy", "true", "1":
		*h = headersFlag(service.HeadersLegacy)
	case "draft11":
		*h = headersFlag(service.HeadersDraft11)
	case "off", "false", "0":
		*h = headersFlag(service.HeadersOff)
	default:
		return fmt.Errorf("want legacy, draft11 or off, got %q", s)
	}
	return nil
}

// pairs is a k=v,k2=v2 flag (or k:v, as envoyproxy/ratelimit writes its
// maps), parsed once when set; nil when never set.
type pairs map[string]string

func (p *pairs) String() string {
	if p == nil || *p == nil {
		return ""
	}
	var parts []string
	for k, v := range *p {
		parts = append(parts, k+"="+v)
	}
	return strings.Join(parts, ",")
}

func (p *pairs) Set(s string) error {
	m, err := envcompat.ParsePairs(s)
	if err != nil {
		return err
	}
	*p = m
	return nil
}

// positiveDuration is a duration flag that must be more than zero.
type positiveDuration struct{ d *time.Duration }

// positive binds a positiveDuration flag to d, set to def.
func positive(d *time.Duration, def time.Duration) positiveDuration {
	*d = def
	return positiveDuration{d}
}

func (p positiveDuration) String() string {
	if p.d == nil {
		return "0s"
	}
	return p.d.String()
}

func (p positiveDuration) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return fmt.Errorf("want a positive duration such as 250ms or 5s, got %q", s)
	}
	*p.d = d
	return nil
}

// positiveIntFlag is an int flag that must be at least 1.
type positiveIntFlag struct{ n *int }

// positiveInt binds a positiveIntFlag to n, set to def.
func positiveInt(n *int, def int) positiveIntFlag {
	*n = def
	return positiveIntFlag{n}
}

func (p positiveIntFlag) String() string {
	if p.n == nil {
		return "0"
	}
	return strconv.Itoa(*p.n)
}

func (p positiveIntFlag) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return fmt.Errorf("want a whole number of at least 1, got %q", s)
	}
	*p.n = n
	return nil
}

// ratioFlag is a share in (0, 1].
type ratioFlag struct{ r *float64 }

// positiveRatio binds a ratioFlag to r, set to def.
func positiveRatio(r *float64, def float64) ratioFlag {
	*r = def
	return ratioFlag{r}
}

func (p ratioFlag) String() string {
	if p.r == nil {
		return "0"
	}
	return strconv.FormatFloat(*p.r, 'g', -1, 64)
}

func (p ratioFlag) Set(s string) error {
	r, err := strconv.ParseFloat(s, 64)
	if err != nil || r <= 0 || r > 1 {
		return fmt.Errorf("want a share in (0, 1], got %q", s)
	}
	*p.r = r
	return nil
}
