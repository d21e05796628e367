package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/incumbentenv"
	"github.com/ratelimitd/ratelimitd/internal/service"
)

// The flag types: each refuses at Set what no value of its flag can be, so
// that the bounds hold (and are tested) without starting a server.

// byteSize is a byte count with an optional KiB, MiB or GiB suffix.
type byteSize int

// String is the count in the largest unit that divides it (1MiB), as
// the usage prints a default.
func (b *byteSize) String() string {
	n := int(*b)
	for _, u := range []struct {
		suffix string
		mult   int
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.mult == 0 {
			return strconv.Itoa(n/u.mult) + u.suffix
		}
	}
	return strconv.Itoa(n)
}

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
	m, err := incumbentenv.ParsePairs(s)
	if err != nil {
		return err
	}
	*p = m
	return nil
}

// bounded is a flag whose value parse reads and refuses outside its
// bounds, saying what it wants.
type bounded[T any] struct {
	p     *T
	parse func(string) (T, bool)
	want  string
}

// bind sets *p to def and returns the flag that sets it.
func bind[T any](p *T, def T, want string, parse func(string) (T, bool)) bounded[T] {
	*p = def
	return bounded[T]{p: p, parse: parse, want: want}
}

func (b bounded[T]) String() string {
	if b.p == nil {
		return ""
	}
	return fmt.Sprint(*b.p)
}

func (b bounded[T]) Set(s string) error {
	v, ok := b.parse(s)
	if !ok {
		return fmt.Errorf("want %s, got %q", b.want, s)
	}
	*b.p = v
	return nil
}

// positive binds a duration flag that must be more than zero.
func positive(d *time.Duration, def time.Duration) bounded[time.Duration] {
	return bind(d, def, "a positive duration such as 250ms or 5s", func(s string) (time.Duration, bool) {
		v, err := time.ParseDuration(s)
		return v, err == nil && v > 0
	})
}

// positiveInt binds an int flag that must be at least 1.
func positiveInt(n *int, def int) bounded[int] {
	return bind(n, def, "a whole number of at least 1", func(s string) (int, bool) {
		v, err := strconv.Atoi(s)
		return v, err == nil && v >= 1
	})
}

// positiveRatio binds a share in (0, 1].
func positiveRatio(r *float64, def float64) bounded[float64] {
	return bind(r, def, "a share in (0, 1]", func(s string) (float64, bool) {
		v, err := strconv.ParseFloat(s, 64)
		return v, err == nil && v > 0 && v <= 1
	})
}

// journalFlag is --charge-journal: auto (the default: on with Redis, of
// every topology), on (a bare flag, true) or off (false).
type journalFlag string

func (j *journalFlag) String() string {
	if *j == "" {
		return "auto"
	}
	return string(*j)
}

func (j *journalFlag) IsBoolFlag() bool { return true }

func (j *journalFlag) Set(s string) error {
	switch strings.ToLower(s) {
	case "auto":
		*j = "auto"
	case "on", "true", "1":
		*j = "on"
	case "off", "false", "0":
		*j = "off"
	default:
		return fmt.Errorf("want auto, on (true) or off (false), got %q", s)
	}
	return nil
}
