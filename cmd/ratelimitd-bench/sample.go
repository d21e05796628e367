package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// counters are what the load tool samples of Redis and the service
// before and after a run.
type counters struct {
	redisCPU, serviceCPU float64
	reads, writes        int64 // the service's read and write system calls
	evalsha, commands    int64
	batches, batched     float64
}

// sample reads Redis's CPU and command counts and the service's CPU.
func sample(ctx context.Context, o *options) (counters, error) {
	var c counters
	if o.redisAddr != "" {
		if err := c.sampleRedis(ctx, o.redisAddr); err != nil {
			return c, fmt.Errorf("-redis: %w", err)
		}
	}
	if o.metricsURL != "" {
		if err := c.sampleMetrics(o.metricsURL); err != nil {
			return c, fmt.Errorf("-metrics: %w", err)
		}
	}
	if o.pid > 0 {
		cpu, err := processCPU(o.pid)
		if err != nil {
			return c, fmt.Errorf("-pid: %w", err)
		}
		c.serviceCPU = cpu
		if c.reads, c.writes, err = processIO(o.pid); err != nil {
			return c, fmt.Errorf("-pid: %w", err)
		}
	}
	return c, nil
}

// sampleRedis reads Redis's CPU seconds and command counts from INFO.
func (c *counters) sampleRedis(ctx context.Context, addr string) error {
	rdb := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
	defer rdb.Close()
	info, err := rdb.Info(ctx, "cpu", "commandstats").Result()
	if err != nil {
		return err
	}
	for _, line := range strings.Split(info, "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		switch {
		case !ok:
		case k == "used_cpu_sys" || k == "used_cpu_user":
			f, _ := strconv.ParseFloat(v, 64)
			c.redisCPU += f
		case strings.HasPrefix(k, "cmdstat_"):
			calls := 0
			for _, kv := range strings.Split(v, ",") {
				if n, ok := strings.CutPrefix(kv, "calls="); ok {
					calls, _ = strconv.Atoi(n)
				}
			}
			if k != "cmdstat_info" {
				c.commands += int64(calls)
			}
			if k == "cmdstat_evalsha" || k == "cmdstat_eval" {
				c.evalsha += int64(calls)
			}
		}
	}
	return nil
}

// sampleMetrics reads the service's batch counts from its /metrics.
func (c *counters) sampleMetrics(url string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, line := range strings.Split(string(body), "\n") {
		name, v, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		f, _ := strconv.ParseFloat(v, 64)
		switch name {
		case "ratelimitd_redis_batch_size_count":
			c.batches = f
		case "ratelimitd_redis_batch_size_sum":
			c.batched = f
		}
	}
	return nil
}

// processCPU is a process's user and system CPU seconds.
func processCPU(pid int) (float64, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name (which may hold spaces): utime is the
	// 14th field, stime the 15th, in clock ticks (100 a second).
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100, nil
}

// processIO is a process's read and write system calls so far (syscr and
// syscw of /proc/PID/io): on a VM where a system call costs microseconds,
// how many a decision takes is much of what it costs.
func processIO(pid int) (reads, writes int64, err error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(stat), "\n") {
		k, v, _ := strings.Cut(line, ": ")
		switch k {
		case "syscr":
			reads, _ = strconv.ParseInt(v, 10, 64)
		case "syscw":
			writes, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return reads, writes, nil
}
