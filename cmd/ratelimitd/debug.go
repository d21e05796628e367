package main

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/redisstore"
)

// cmdline is pprof's /debug/pprof/cmdline without the secrets of a Redis
// URL given on the command line.
func cmdline(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	args := make([]string, len(os.Args))
	for i, a := range os.Args {
		args[i] = redisstore.Redact(a)
	}
	fmt.Fprint(w, strings.Join(args, "\x00"))
}

// startDebug serves pprof on addr until the returned stop is called.
func startDebug(addr string, log *slog.Logger) (stop func(), err error) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return serveAside("--debug-addr", addr, mux, log)
}

// serveAside serves h on addr, a listener of its own beside the main
// ones, until the returned stop is called, which closes the server and
// waits for its goroutine. flag names addr in errors and logs.
func serveAside(flag, addr string, h http.Handler, log *slog.Logger) (stop func(), err error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := srv.Serve(lis); err != nil && err != http.ErrServerClosed {
			log.Error("server stopped", "flag", flag, "err", err)
		}
	})
	log.Info("serving on "+flag, "addr", lis.Addr().String())
	return func() {
		_ = srv.Close()
		wg.Wait()
	}, nil
}
