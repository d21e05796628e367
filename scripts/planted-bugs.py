#!/usr/bin/env python3
"""Plants each bug of a list in the tree, one at a time, runs the test that
stands guard against it, and says whether the test caught it; the tree is
restored after each. Every bug here once passed every test (docs/TESTING.md):
a guard that stops catching its bug is reported MISSED. Reported, not gating:

    scripts/planted-bugs.py          # all
    scripts/planted-bugs.py 4 7      # by number

Each entry: name, file, text, its planted replacement, package, test.
Needs redis-server on the PATH (or RATELIMITD_REDIS_SERVER).
"""
import os
import shutil
import subprocess
import sys

os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
env = dict(os.environ)
env.setdefault('RATELIMITD_REDIS_SERVER', shutil.which('redis-server') or '')
muts = [
    ("1 sliding TTL one window short","internal/redisstore/scripts/decide.lua","ttl[q] = px(we + w + GRACE)","ttl[q] = px(we + GRACE)","./internal/redisstore","TestKeyTTLsCoverTheState"),
    ("2 token bucket TTL 1 s","internal/redisstore/scripts/decide.lua","ex = px(c + GRACE)","ex = '1000'","./internal/redisstore","TestKeyTTLsCoverTheState"),
    ("3 cache blocks a whole window","internal/service/decide.go","now.Add(time.Duration(res[j].ResetUS)*time.Microsecond)","now.Add(time.Duration(ch.WindowUS)*time.Microsecond)","./internal/service","TestCacheBlocksUntilExactReset"),
    ("4 no pcall","internal/redisstore/scripts/decide.lua","local ok, err = pcall(decide, k0, n)","decide(k0, n) local ok, err = true, nil","./internal/redisstore","TestScriptErrorStaysWithItsRequest"),
    ("5 cluster no refund of earlier slots","internal/limit/order.go","undo(ctx, checks, groups[:g], results, groups[g+1:])","undo(ctx, checks, nil, results, groups[g+1:])","./internal/redisstore","TestCluster$"),
    ("6 duplicate key-only accepted","config/parse.go","prev, kr.def = kr.def, r","kr.def = r","./config","TestBadConfigs"),
    ("7 gRPC health SERVING while draining","internal/server/server.go","\ts.health.Shutdown()\n","","./internal/server","TestShutdownDrains"),
    ("8 store called inside the margin","internal/service/decide.go","return nil, ErrNoTime","_ = ErrNoTime","./internal/service","TestNoStoreCallInsideTheMargin"),
    ("9 refund below zero kept","internal/redisstore/scripts/decide.lua","        if c < 0 then c = 0 end\n","","./internal/redisstore","TestRefund$"),
    ("10 hits not saturated (bypass)","internal/redisstore/script.go","c.SaturatedHits()<<20","c.Hits<<20","./internal/redisstore","TestMatchesMemstore"),
    ("11 parser without walk budget","config/limits.go","if p.walked > MaxWalkNodes {","if p.walked > MaxWalkNodes*1000 {","./config","TestBombsBounded"),
    ("12 no stream limit","cmd/ratelimitd/grpc.go","grpc.MaxConcurrentStreams(s.grpcMaxStreams),","","./cmd/ratelimitd","TestSlowReaderBounded"),
    ("13 secret in URL error","internal/redisstore/client.go",'return nil, nil, "", urlError("parse the URL", opts.URL, err)','return nil, nil, "", fmt.Errorf("redisstore: parse the URL: %w", err)',"./internal/redisstore","TestURLErrorsHideSecrets"),
]
only = sys.argv[1:]
missed = 0
for name, f, old, new, pkg, test in muts:
    if only and name.split()[0] not in only:
        continue
    src = open(f).read()
    if old not in src:
        print(f"STALE: {name}: {f} no longer holds the text to change; update this list", flush=True)
        missed += 1
        continue
    open(f, 'w').write(src.replace(old, new, 1))
    try:
        r = subprocess.run(['go', 'test', '-count=1', '-run', test, pkg], capture_output=True, text=True, env=env, timeout=600)
        out = r.stdout + r.stderr
        status = 'CAUGHT' if r.returncode != 0 else 'MISSED'
        missed += status == 'MISSED'
        lines = [l.strip() for l in out.splitlines() if ('_test.go' in l and ':' in l) or 'build failed' in l]
        print(f"{status}: {name} by {test}: {lines[0][:200] if lines else out[-300:]}", flush=True)
    finally:
        open(f, 'w').write(src)
sys.exit(1 if missed else 0)
