package server

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/ratelimitd/ratelimitd/internal/service"
)

// MaxJSONBody bounds a /json request body.
const MaxJSONBody = 1 << 20

func (s *Server) httpHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /json", s.handleJSON)
	mux.HandleFunc("GET /healthcheck", s.handleHealth)
	mux.HandleFunc("GET /rlconfig", s.handleRules)
	if s.opts.Metrics != nil {
		mux.Handle("GET /metrics", s.opts.Metrics)
	}
	return mux
}

// handleJSON decides a protojson RateLimitRequest: 200 with the response
// when OK, 429 when OVER_LIMIT, 400 for a malformed or invalid request,
// 413 for a body over MaxJSONBody, 503 while no rules are loaded.
func (s *Server) handleJSON(w http.ResponseWriter, r *http.Request) {
	buf := jsonBufs.Get().(*bytes.Buffer)
	defer putJSONBuf(buf)
	buf.Reset()
	if _, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, MaxJSONBody)); err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			http.Error(w, fmt.Sprintf("request body over the %d bytes (1 MiB) a /json request may have", MaxJSONBody), http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "reading body: "+err.Error(), http.StatusBadRequest)
		return
	}
	var req rlsv3.RateLimitRequest
	if err := protojson.Unmarshal(buf.Bytes(), &req); err != nil {
		http.Error(w, "invalid RateLimitRequest JSON: "+err.Error(), http.StatusBadRequest)
		return
	}
	ctx := r.Context()
	if s.opts.Tracing != nil {
		var span trace.Span
		ctx, span = s.opts.Tracing.Start(ctx, "POST /json", propagation.HeaderCarrier(r.Header))
		defer span.End()
	}
	resp, err := s.dec.ShouldRateLimit(ctx, &req)
	switch {
	case errors.Is(err, service.ErrInvalidRequest):
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	case errors.Is(err, service.ErrNoRules):
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	case err != nil:
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	out, ok := appendResponseJSON(buf.Bytes()[:0], resp)
	if !ok {
		out, err = protojson.MarshalOptions{}.MarshalAppend(buf.Bytes()[:0], resp)
	}
	if err != nil {
		http.Error(w, "encoding response: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
		w.WriteHeader(http.StatusTooManyRequests)
	}
	_, _ = w.Write(out)
}

// jsonBufs hold /json bodies and answers between requests: a request's
// body is read into one, and its answer written over it once decided.
var jsonBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// putJSONBuf keeps buffers of ordinary requests only: one a huge body grew
// would stay allocated.
func putJSONBuf(b *bytes.Buffer) {
	if b.Cap() <= 64<<10 {
		jsonBufs.Put(b)
	}
}

// handleHealth answers 200 OK while serving, 503 once shutdown began.
func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	if !s.serving() {
		http.Error(w, "shutting down", http.StatusServiceUnavailable)
		return
	}
	_, _ = io.WriteString(w, "OK\n")
}

// handleRules shows the rules in force, one line per limited rule.
func (s *Server) handleRules(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	rules := s.dec.Rules()
	if rules == nil {
		http.Error(w, service.ErrNoRules.Error(), http.StatusServiceUnavailable)
		return
	}
	_, _ = io.WriteString(w, "# rules hash "+rules.Hash+"\n")
	_, _ = io.WriteString(w, rules.Dump())
}
