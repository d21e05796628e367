package config

import (
	"fmt"
	"strings"
	"time"
)

// Unit is the time unit of a rate limit. Its numeric values are those of
// Envoy's RateLimitResponse.RateLimit.Unit enum, so converting is a cast.
type Unit int32

// The units of the rules format. Month and year are fixed 30- and 365-day
// blocks counted from the Unix epoch, as envoyproxy/ratelimit defines them.
const (
	UnitUnknown Unit = 0
	UnitSecond  Unit = 1
	UnitMinute  Unit = 2
	UnitHour    Unit = 3
	UnitDay     Unit = 4
	UnitMonth   Unit = 5
	UnitYear    Unit = 6
	UnitWeek    Unit = 7
)

var unitNames = map[string]Unit{
	"second": UnitSecond,
	"minute": UnitMinute,
	"hour":   UnitHour,
	"day":    UnitDay,
	"week":   UnitWeek,
	"month":  UnitMonth,
	"year":   UnitYear,
}

// ParseUnit parses a unit name case-insensitively.
func ParseUnit(s string) (Unit, error) {
	if u, ok := unitNames[strings.ToLower(s)]; ok {
		return u, nil
	}
	return UnitUnknown, fmt.Errorf("unknown unit %q (want second, minute, hour, day, week, month or year)", s)
}

// Duration is the length of one window of the unit.
func (u Unit) Duration() time.Duration {
	switch u {
	case UnitSecond:
		return time.Second
	case UnitMinute:
		return time.Minute
	case UnitHour:
		return time.Hour
	case UnitDay:
		return 24 * time.Hour
	case UnitWeek:
		return 7 * 24 * time.Hour
	case UnitMonth:
		return 30 * 24 * time.Hour
	case UnitYear:
		return 365 * 24 * time.Hour
	}
	return 0
}

// String returns the lower-case name used in rules files.
func (u Unit) String() string {
	for name, v := range unitNames {
		if v == u {
			return name
		}
	}
	return "unknown"
}
