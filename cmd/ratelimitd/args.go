package main

// How the server's arguments are read beyond the flag package: values
// after a space for flags that may stand bare, and errors that say what
// a flag takes.

import (
	"flag"
	"fmt"
	"slices"
	"strings"

	"github.com/ratelimitd/ratelimitd/internal/redisstore"
)

// explainValues makes the flags whose own errors say little ("parse
// error", "unknown name") say what they take.
func explainValues(fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		switch want := stdWants[fmt.Sprintf("%T", f.Value)]; {
		case f.Name == "log-level":
			f.Value = wantValue{f.Value, "debug, info, warn or error"}
		case isBoolFlag(f) && enumValues[f.Name] == nil:
			f.Value = wantBool{wantValue{f.Value, "true or false"}}
		case want != "":
			f.Value = wantValue{f.Value, want}
		}
	})
}

// stdWants are what the flag package's own value types take, by type.
var stdWants = map[string]string{
	"*flag.intValue": "a whole number", "*flag.int64Value": "a whole number",
	"*flag.uintValue": "a whole number, 0 or more", "*flag.uint64Value": "a whole number, 0 or more",
	"*flag.float64Value": "a number", "*flag.durationValue": "a duration such as 250ms, 5s or 1m",
}

// wantValue is a flag value whose error on a bad value says what it
// takes.
type wantValue struct {
	flag.Value
	want string
}

func (e wantValue) Set(v string) error {
	if err := e.Value.Set(v); err != nil {
		return fmt.Errorf("want %s", e.want)
	}
	return nil
}

// wantBool is wantValue for a true/false flag, which stands bare.
type wantBool struct{ wantValue }

func (wantBool) IsBoolFlag() bool { return true }

// enumValues are the values a flag that may stand bare (a bool-style
// flag, such as --response-headers) takes after a space too.
var enumValues = map[string][]string{
	"response-headers": {"legacy", "draft11", "off", "true", "false"},
	"charge-journal":   {"auto", "on", "off", "true", "false"},
}

// boolValues are what a true/false flag takes after a space too: the
// words strconv.ParseBool reads, but for 1 and 0.
var boolValues = []string{"true", "false", "t", "f"}

// spacedValues are the values flag name takes after a space (none: it
// takes a value after "=" only, or always takes the next argument).
func spacedValues(fs *flag.FlagSet, name string) []string {
	if vals, ok := enumValues[name]; ok {
		return vals
	}
	if f := fs.Lookup(name); f != nil && isBoolFlag(f) {
		return boolValues
	}
	return nil
}

// unexpectedArg is the error for fs's first argument left over: after a
// flag that may stand bare, it names the flag and what it takes.
func unexpectedArg(fs *flag.FlagSet, args []string) error {
	arg := fs.Arg(0)
	if i := len(args) - fs.NArg(); i > 0 && args[i-1] != "--" {
		prev := args[i-1]
		name := strings.TrimLeft(prev, "-")
		if vals := spacedValues(fs, name); len(vals) > 0 && strings.HasPrefix(prev, "-") {
			if vals[0] == boolValues[0] {
				vals = vals[:2]
			}
			return usagef("ratelimitd", "unexpected argument %q after %s, which takes %s: write %s=VALUE", redisstore.Redact(arg), prev, strings.Join(vals, ", "), prev)
		}
	}
	return usagef("ratelimitd", "unexpected argument %q: the server takes flags only (a command is the first argument)", redisstore.Redact(arg))
}

// joinEnumValues rewrites "--flag value" as "--flag=value" for a flag that
// may stand bare, when value is one of its values: the flag package would
// take the bare flag and leave value as an argument.
func joinEnumValues(fs *flag.FlagSet, args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		name := strings.TrimLeft(a, "-")
		vals := spacedValues(fs, name)
		if len(vals) > 0 && strings.HasPrefix(a, "-") && len(a)-len(name) <= 2 && i+1 < len(args) &&
			slices.Contains(vals, strings.ToLower(args[i+1])) {
			out = append(out, a+"="+args[i+1])
			i++
			continue
		}
		out = append(out, a)
	}
	return out
}
