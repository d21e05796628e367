package redisstore

import (
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// redacted stands for a secret in anything printed.
const redacted = "xxxxx"

// Redact returns s with the secrets of every URL in it replaced: the
// password of a userinfo (all of a userinfo without one) and the value of
// every query parameter whose name holds "password". It works on text
// that does not parse as a URL, such as the error about a URL that did not
// parse, which quotes it whole.
func Redact(s string) string {
	for _, secret := range secrets(s, false) {
		s = strings.ReplaceAll(s, secret, redacted)
	}
	return s
}

// secrets finds the secrets of every URL in s, longest first (so that a
// secret holding a shorter one is replaced whole), with the forms they
// take when unescaped or quoted. In text, a URL ends at whitespace or a
// quote; whole says that s is one URL, whatever it holds.
func secrets(s string, whole bool) []string {
	var out []string
	add := func(v string) {
		if v == "" || v == redacted {
			return
		}
		out = append(out, v)
		if u, err := url.PathUnescape(v); err == nil && u != v && u != "" {
			out = append(out, u)
		}
		if q := strconv.Quote(v); q[1:len(q)-1] != v {
			out = append(out, q[1:len(q)-1])
		}
	}
	for rest := s; ; {
		i := strings.Index(rest, "://")
		if i < 0 {
			break
		}
		rest = rest[i+3:]
		// The URL runs to whitespace or a quote: what error messages and
		// command lines put around it.
		end := strings.IndexAny(rest, " \t\n\"'`")
		if end < 0 || whole {
			end = len(rest)
		}
		tok := rest[:end]
		if at := strings.LastIndex(tok, "@"); at >= 0 {
			user := tok[:at]
			if _, pass, ok := strings.Cut(user, ":"); ok {
				add(pass)
			} else {
				add(user)
			}
		}
		if _, query, ok := strings.Cut(tok, "?"); ok {
			for _, kv := range strings.Split(query, "&") {
				if k, v, ok := strings.Cut(kv, "="); ok && strings.Contains(strings.ToLower(k), "password") {
					add(v)
				}
			}
		}
	}
	slices.SortStableFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}

// urlError wraps the parse error of a Redis URL without its secrets.
func urlError(what, raw string, err error) error {
	return &redactedError{msg: "redisstore: " + what + ": " + urlProblem(raw, err)}
}

// urlProblem is err, raw's parse error, redacted, and the URLs accepted.
func urlProblem(raw string, err error) string {
	msg := err.Error()
	for _, secret := range secrets(raw, true) {
		msg = strings.ReplaceAll(msg, secret, redacted)
	}
	return Redact(msg) + "; " + urlForms
}

// urlForms says which Redis URLs are accepted, for a URL that is not one.
const urlForms = "want redis://[user:password@]host:port[/db] (rediss:// for TLS, unix:///path for a socket); " +
	"Sentinel: redis://sentinel:26379?master_name=NAME[&addr=sentinel2:26379]; Cluster: redis://node1:7000?addr=node2:7001"

// redactedError is an error whose text has had its secrets removed; it
// deliberately does not unwrap to the original, which holds them.
type redactedError struct{ msg string }

func (e *redactedError) Error() string { return e.msg }
