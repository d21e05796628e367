package redisstore

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// ErrUnavailable marks every failure to get a decision from Redis: it could
// not be reached in time, or it refused the script (OOM, NOREPLICAS,
// READONLY, LOADING, ...). The service answers such checks by policy.
var ErrUnavailable = errors.New("redisstore: unavailable")

// ErrBreakerOpen is returned, wrapped with ErrUnavailable, while the
// breaker is open: Redis failed repeatedly and is not asked until a
// background probe finds it answering.
var ErrBreakerOpen = errors.New("redisstore: breaker open")

// Error classes, the values of the class label of
// ratelimitd_redis_errors_total.
const (
	ClassTimeout     = "timeout"
	ClassConnection  = "connection"
	ClassBreakerOpen = "breaker_open"
	ClassNoReplicas  = "noreplicas"
	ClassOOM         = "oom"
	ClassReadOnly    = "readonly"
	ClassLoading     = "loading"
	ClassClusterDown = "clusterdown"
	ClassMasterDown  = "masterdown"
	ClassBusy        = "busy"
	ClassOverload    = "overload"
	ClassCanceled    = "canceled"
	ClassOther       = "other"
)

// Classify names the class of a Redis call's error, "" for nil.
func Classify(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrBreakerOpen):
		return ClassBreakerOpen
	case errors.Is(err, errQueueFull):
		return ClassOverload
	}
	if c := replyClass(err); c != "" {
		return c
	}
	return transportClass(err)
}

// replyClass is the class of an error reply of Redis's, "" for an
// error of another kind. go-redis's own helpers see through wrapping;
// the script's per-request errors (scriptError) are Redis errors to them
// too.
func replyClass(err error) string {
	switch {
	case redis.IsNoReplicasError(err):
		return ClassNoReplicas
	case redis.IsOOMError(err):
		return ClassOOM
	case redis.IsReadOnlyError(err):
		return ClassReadOnly
	case redis.IsLoadingError(err):
		return ClassLoading
	case redis.IsClusterDownError(err):
		return ClassClusterDown
	case redis.IsMasterDownError(err):
		return ClassMasterDown
	case redis.HasErrorPrefix(err, "BUSY"):
		return ClassBusy
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		return ClassOther
	}
	return ""
}

// transportClass is the class of an error that is not a reply: a
// timeout, a lost or refused connection, or other.
func transportClass(err error) string {
	var nerr net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled),
		errors.As(err, &nerr) && nerr.Timeout(),
		errors.Is(err, redis.ErrPoolTimeout):
		return ClassTimeout
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, redis.ErrClosed):
		return ClassConnection
	}
	var operr *net.OpError
	if errors.As(err, &operr) {
		return ClassConnection
	}
	return ClassOther
}

// tripsBreaker reports whether an error class means Redis is not
// answering, so that waiting on it again would only add latency. Error
// replies (OOM, NOREPLICAS, ...) come back at once and do not trip it.
func tripsBreaker(class string) bool {
	return class == ClassTimeout || class == ClassConnection
}

// readTimedOut reports a call written whose answer did not come in
// time: go-redis reports its read's timeout as a *net.OpError "read".
// (A connection's setup timing out comes unwrapped from it, and says the
// call was never written.)
func readTimedOut(err error) bool {
	var operr *net.OpError
	return errors.As(err, &operr) && operr.Op == "read" && operr.Timeout()
}
