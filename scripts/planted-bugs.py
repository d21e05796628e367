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
    ("11 parser without walk budget","config/limits.go","if p.walked > MaxWalkNodes {","if p.walked > MaxWalkNodes*1000 {","./config","TestBombsBounded"),
    ("12 no stream limit","cmd/ratelimitd/grpc.go","grpc.MaxConcurrentStreams(s.grpcMaxStreams),","","./cmd/ratelimitd","TestSlowReaderBounded"),
    ("13 secret in URL error","internal/redisstore/client.go",'return nil, nil, "", urlError("parse the URL", opts.URL, err)','return nil, nil, "", fmt.Errorf("redisstore: parse the URL: %w", err)',"./internal/redisstore","TestURLErrorsHideSecrets"),
    ("14 node estimate too low","config/limits.go","return 1 + items + 2*pairs","return 1 + items + pairs","./config","TestEstimateNodesBounds"),
    ("15 parse ignores cancellation","config/limits.go","if err := p.ctx.Err(); err != nil {","if err := p.ctx.Err(); err != nil && false {","./config","TestLoadCanceled"),
    ("16 unreadable rules file skipped","config/load.go",'errs = append(errs, &Error{File: full, Msg: "unreadable rules file: " + err.Error()})',"_ = err","./config","TestUnreadableRulesFile"),
    ("17 check-config ignores signals","cmd/ratelimitd/tools.go","config.LoadWith(ctx, config.Options","config.LoadWith(context.Background(), config.Options","./cmd/ratelimitd","TestCheckConfigStopsOnSignal"),
    ("18 domains merged unasked","config/load.go","if !opts.MergeDomains {","if false {","./cmd/ratelimitd","TestCheckConfig$|TestMergeDomainsFlag"),
    ("19 merged duplicate accepted","config/merge.go","dup(okr.exact[v], prev)","_ = prev","./config","TestMergeDomains"),
    ("20 password option ignored","internal/redisstore/client.go","*c.password = opts.Password","_ = opts.Password","./internal/redisstore","TestPasswordOption"),
    ("21 password query values printed","internal/redisstore/redact.go",'strings.Contains(strings.ToLower(k), "password")','false && strings.Contains(strings.ToLower(k), "password")',"./internal/redisstore","TestRedact|TestURLErrorsHideSecrets"),
    ("22 canceled caller answered by policy","internal/service/decide.go","if err != nil && errors.Is(ctx.Err(), context.Canceled) {","if false {","./internal/service","TestCanceledCallerNotAnswered"),
    ("23 breaker opens on one failed round trip","internal/redisstore/breaker.go","if b.open.Load() || b.fails < b.minFails || time.Since(b.failSince) < b.openAfter {","if b.open.Load() {","./internal/redisstore","TestSlowRoundTripKeepsBreakerClosed|TestBreakerKillRestart"),
    ("24 stale round trips count against Redis","internal/redisstore/breaker.go","if start.UnixNano() < b.lastSuccess.Load() {","if false {","./internal/redisstore","TestBreakerIgnoresStaleRoundTrips"),
    ("25 open breaker probes every interval","internal/redisstore/breaker.go","\t\tstart := time.Now()\n\t\tctx, cancel := context.WithTimeout(context.Background(), b.interval)","\t\tselect {\n\t\tcase <-b.done:\n\t\t\treturn\n\t\tcase <-time.After(b.interval):\n\t\t}\n\t\tstart := time.Now()\n\t\tctx, cancel := context.WithTimeout(context.Background(), b.interval)","./internal/redisstore","TestOpenBreakerProbesBackToBack"),
    ("26 script arguments packed otherwise","internal/redisstore/script.go","hits<<20|uint64((q+1)*16+flags)","hits<<20|uint64((q+1)*16+flags^2)","./internal/redisstore","TestScriptArgsGolden"),
    ("27 served pair never reloaded","cmd/ratelimitd/tls.go","if cert != nil {\n\t\tid.cert.Store(cert)","if cert != nil && id.cert.Load() == nil {\n\t\tid.cert.Store(cert)","./cmd/ratelimitd","TestCertificateRotation|TestRedisCertificateRotation"),
    ("28 CA never reloaded","cmd/ratelimitd/tls.go","if pool != nil {\n\t\tid.pool.Store(pool)","if pool != nil && id.pool.Load() == nil {\n\t\tid.pool.Store(pool)","./cmd/ratelimitd","TestCertificateRotation|TestRedisCertificateRotation"),
    ("29 file changes never reported","internal/filewatch/filewatch.go","\t\t\tchanged()\n","\t\t\t_ = changed\n","./internal/filewatch","TestWatchWriteAndRename"),
    ("30 per-second rejection keeps the main store's hits","internal/limit/order.go","undo(ctx, checks, groups[:g], results, groups[g+1:])","undo(ctx, checks, nil, results, groups[g+1:])","./internal/persecond","TestAllOrNothingAcrossStores"),
    ("31 grant past the limit","internal/limit/grant.go","g = min(n, c.Limit-st.Count)","g = min(n, c.Limit-st.Count+1)","./internal/limit","TestGrantNeverExceeds"),
    ("32 give-back into another window","internal/limit/grant.go","if st.End != windowEnd {\n\t\t\treturn 0\n\t\t}","","./internal/limit","TestGiveBackOnlyInItsWindow"),
    ("33 grant.lua grants one too many","internal/redisstore/scripts/grant.lua","if est < l then done = math.min(n, l - est) end","if est < l then done = math.min(n, l - est + 1) end","./internal/redisstore","TestGrantMatchesLimit"),
    ("34 explain misses replaced limits","internal/service/explain.go","case it.replaced:","case false && it.replaced:","./cmd/ratelimitd","TestExplain"),
    ("35 diff misses counters starting afresh","cmd/ratelimitd/diff.go",'\t\td.note("its counters start afresh (the window or algorithm is part of the counter key)")\n',"","./cmd/ratelimitd","TestDiff"),
    ("36 env compat takes what it cannot honour","internal/envcompat/envcompat.go","case e.Refuse != \"\" && !slices.ContainsFunc(","case false && e.Refuse != \"\" && !slices.ContainsFunc(","./internal/envcompat","TestEnvoyproxy$"),
    ("37 per-second counters stay in the main Redis","internal/persecond/persecond.go","if window(i) == Window {","if window(i) == 0 {","./internal/persecond","TestAllOrNothingAcrossStores"),
    ("38 invalid xDS set ACKed","internal/xds/xds.go","\t\t\tif err := s.client.Nack(s.badErr); err != nil {\n\t\t\t\treturn got, err\n\t\t\t}\n\t\t\tcontinue\n\t\t}\n\t\ts.badErr = \"\"","\t\t\tif err := s.client.Ack(); err != nil {\n\t\t\t\treturn got, err\n\t\t\t}\n\t\t\tcontinue\n\t\t}\n\t\ts.badErr = \"\"","./internal/xds","TestStream"),
    ("39 xDS NACK loop unpaced","internal/xds/xds.go","if s.badErr != \"\" && sum == s.badSum {","if false && s.badErr != \"\" && sum == s.badSum {","./internal/xds","TestStream"),
    ("40 xDS stream never reopened","internal/xds/xds.go","\t\twait = min(2*wait, o.BackoffMax)\n","\t\t<-ctx.Done()\n","./internal/xds","TestStream"),
    ("41 xDS rules not checked as files are","internal/xds/xds.go","return config.LoadDocs(ctx, opts, docs)","opts.MergeDomains = true\n\treturn config.LoadDocs(ctx, opts, docs)","./internal/xds","TestRenderMatchesFile"),
    ("42 xDS client trusts any server","cmd/ratelimitd/xds.go","c.VerifyConnection = tlsverify.Against(id.roots, name, \"xds: the management server\")","_ = tlsverify.Against(id.roots, name, \"\")","./cmd/ratelimitd","TestRulesOverXDSTLS"),
    ("43 invalid xDS set replaces the rules","cmd/ratelimitd/xds.go","\t\tst.apply(s, err)\n","\t\tif err != nil {\n\t\t\ts, err = config.LoadDocs(ctx, st.load, nil)\n\t\t}\n\t\tst.apply(s, err)\n","./cmd/ratelimitd","TestRulesOverXDS$"),
    ("44 header names ignored","internal/service/headers.go","&corev3.HeaderValue{Key: names.Limit,","&corev3.HeaderValue{Key: HeaderLimit,","./internal/service","TestHeaders"),
    ("45 grants used past their window","internal/redisstore/lease.go","valid := now.Before(g.validTill)","valid := true","./internal/redisstore","TestLeaseRollover"),
    ("46 rejected request keeps its reservations","internal/redisstore/lease.go","\t\t\tif r.g.gen == r.gen {\n\t\t\t\tr.g.avail += r.hits","\t\t\tif r.g.gen == r.gen {\n\t\t\t\t_ = r.hits","./internal/redisstore","TestLeaseMixedRejected"),
    ("47 what a grant lacks decided without it","internal/redisstore/lease.go","toRedis(i, g, hits-r)","toRedis(i, g, hits)","./internal/redisstore","TestLeaseDifferential"),
    ("48 held hits usable while given back","internal/redisstore/lease.go","\t\t\tg.avail, g.used, g.inFlight = 0, 0, true\n\t\t\tg.gen++","\t\t\tg.inFlight = true","./internal/redisstore","TestLeaseGiveBack|TestLeaseBucketExpiry"),
    ("49 refunds fill the grant without bound","internal/redisstore/lease.go","k = min(g.used, hits)","k = hits","./internal/redisstore","TestLeaseRefundBounded"),
    ("50 a refund to Redis frees the held hits too","internal/redisstore/lease.go","\t\t\t\trest += g.avail\n","\t\t\t\t_ = 0\n","./internal/redisstore","TestLeaseRefundBounded"),
    ("51 expired hits given back into the next window","internal/redisstore/lease.go","\t\t\tif valid {\n\t\t\t\t// The rest goes to Redis","\t\t\tif true {\n\t\t\t\t// The rest goes to Redis","./internal/redisstore","TestLeaseDifferential"),
    ("52 local decisions wait on Redis too","internal/redisstore/lease.go","\tif len(sub) == 0 {\n\t\treturn results, nil","\tif false {\n\t\treturn results, nil","./internal/redisstore","TestLeaseThroughStalls"),
    ("53 reservations not taken from the grant","internal/redisstore/lease.go","\t\t\tg.avail -= r\n","\t\t\t_ = 0\n","./internal/redisstore","TestLeaseFleetNeverExceeds"),
    ("54 Cluster grants in one cross-slot call","internal/redisstore/grant.go","if s.cluster != nil && len(ops) > 1 {","if false {","./internal/redisstore","TestClusterLeases"),
    ("55 cold counters take single-hit grants","internal/redisstore/lease.go","if want < 2 || g.avail >= want ||","if want < 1 || g.avail >= want ||","./internal/redisstore","TestLeaseColdCounter"),
    ("56 the service drops lease: true","internal/service/decide.go","Burst: it.burst, Lease: it.lease, Usage:","Burst: it.burst, Lease: false && it.lease, Usage:","./internal/service","TestLeasedRule"),
    ("57 lease: true not parsed","config/parse.go","\t\tl.Lease = p.boolean(v, path+\".lease\")","\t\t_ = p.boolean(v, path+\".lease\")","./config","TestAlgorithms"),
    ("58 a short grant refused instead of asked of Redis","internal/redisstore/lease.go","\t\ttoRedis(i, g, hits-r)\n","\t\tresults[i] = limit.Result{Over: true}\n\t\tcontinue\n","./cmd/ratelimitd","TestLeaseHolderKilled"),
    ("59 LIMIT_REMAINING_HEADER ignored","internal/envcompat/envcompat.go","{Name: \"LIMIT_REMAINING_HEADER\", Flag: \"response-header-remaining\"},","","./cmd/ratelimitd","TestEnvoyproxyEnvironment"),
    ("60 decision metadata without reset_us","internal/service/decide.go","reasons[i].(map[string]any)[\"reset_us\"] = float64(max(us, 0))","_ = us","./cmd/ratelimitd","TestHealthcheckAndDebug"),
    ("61 idle grants never given back","internal/redisstore/lease.go","case g.avail > 0 && (all || idle ||","case g.avail > 0 && (all ||","./internal/redisstore","TestLeaseGiveBack"),
    ("62 xDS stream state not reported","internal/xds/xds.go","\ts.o.Metrics.XDSStream(true)\n","","./cmd/ratelimitd","TestRulesOverXDS$"),
    ("63 near_limit counts every hit past the threshold's request","internal/compatstats/rules.go","c.nearLimit.Add(after - max(near, before))","c.nearLimit.Add(hits)","./internal/compatstats","TestCounting"),
    ("64 over_limit counts every hit of a crossing request","internal/compatstats/rules.go","c.overLimit.Add(after - limit)","c.overLimit.Add(hits)","./internal/compatstats","TestCounting"),
    ("65 stats names from request values uncapped","internal/compatstats/rules.go","if rs.perRule[r] >= rs.s.opts.NameCap {","if false {","./internal/compatstats","TestNameCap"),
    ("66 shadow hits not counted","internal/service/decide.go","\t\t\tstats.Shadow(it.hits)\n","","./cmd/ratelimitd","TestIncumbentStats"),
    ("67 local-cache answers not counted over","internal/compatstats/rules.go","\t\tc.overLimit.Add(hits)\n\t\tc.overLocal.Add(hits)","\t\tc.overLocal.Add(hits)","./internal/service","TestLocalCacheStats"),
    ("68 later YAML documents dropped","config/parse.go","\t\t\tdomains = append(domains, d)\n","\t\t\tdomains = append(domains, d)\n\t\t\tbreak\n","./config","TestGeneratorOutput"),
    ("69 rate_limit: null read as a limit","config/parse.go","if v, ok := f[\"rate_limit\"]; ok && !(v.Kind == yaml.ScalarNode && v.Tag == \"!!null\") {","if v, ok := f[\"rate_limit\"]; ok {","./config","TestGeneratorOutput"),
    ("70 xDS units by v0.1.0's names","internal/xds/xds.go","\t\t\t\tl.Unit = unitName(p.GetUnit())","\t\t\t\tl.Unit = strings.ToLower(p.GetUnit().String())","./internal/xds","TestUnits"),
    ("71 xDS quota_mode dropped","internal/xds/xds.go","\t\t\t\ty.QuotaMode = quota","\t\t\t\t_ = quota","./internal/xds","TestUnits"),
    ("72 run as ratelimit, the incumbent's environment ignored","cmd/ratelimitd/main.go","if strings.TrimSuffix(filepath.Base(argv0), \".exe\") != IncumbentName {","if strings.TrimSuffix(filepath.Base(argv0), \".exe\") != IncumbentName+\"-\" {","./cmd/ratelimitd","TestEnvFor|TestImageSwap"),
    ("73 before the first xDS set, OK","cmd/ratelimitd/run.go","\tcase s.xds.beforeRules == \"ok\":","\tdefault:","./cmd/ratelimitd","TestRulesOverXDSTLS"),
    ("75 a panel names a metric that is not exported","deploy/grafana/ratelimitd.json","min(ratelimitd_xds_connected)","min(ratelimitd_xds_connection_up)","./deploy","TestDashboardUsesRealMetrics"),
    ("76 a panel groups by a label its metric lacks","deploy/grafana/ratelimitd.json","sum by (how) (rate(ratelimitd_lease_requests_total","sum by (what) (rate(ratelimitd_lease_requests_total","./deploy","TestDashboardUsesRealMetrics"),
    ("77 no redis child span","internal/redisstore/redisstore.go","if s.tracer != nil && trace.SpanFromContext(ctx).IsRecording() {","if false {","./cmd/ratelimitd","TestTracing$"),
    ("78 the caller's trace context ignored","internal/tracing/tracing.go","\tctx = t.propagator.Extract(ctx, carrier)\n","","./cmd/ratelimitd","TestTracing$"),
    ("79 lost spans not counted","internal/tracing/tracing.go","\t\t\tq.onDrop(\"export_failed\", len(batch))\n","","./cmd/ratelimitd","TestTracingHTTP"),
    ("80 a rules file one byte over the cap cut and parsed","config/load.go","io.LimitReader(fh, MaxFileSize+1)","io.LimitReader(fh, MaxFileSize)","./config","TestFileSizeCapExact"),
    ("81 metadata nodes not charged to the walk budget","config/limits.go","\t\tn = deref(n)\n\t\tif !p.charge(1) {\n\t\t\treturn nil, errStopped\n\t\t}\n","\t\tn = deref(n)\n","./config","TestMetadataChargedToWalk"),
    ("82 a canceled caller read from the store's error","internal/service/decide.go","if err != nil && errors.Is(ctx.Err(), context.Canceled) {","if err != nil && errors.Is(err, context.Canceled) {","./internal/service","TestCancellationIsTheCallers"),
    ("83 xDS repeat detection depends on the resources' order","internal/xds/xds.go","\tslices.SortFunc(sums, func(a, b [sha256.Size]byte) int { return bytes.Compare(a[:], b[:]) })\n","\t_ = bytes.Compare\n","./internal/xds","TestSetSumIgnoresOrder"),
    ("84 xDS reconnect backoff never grows","internal/xds/xds.go","wait = min(2*wait, o.BackoffMax)","wait = min(wait, o.BackoffMax)","./internal/xds","TestBackoffGrows"),
    ("85 canceled round trips count against Redis","internal/redisstore/breaker.go","case errors.Is(err, context.Canceled) || deadline.Sub(start) < minBudget:","case false && errors.Is(err, context.Canceled) || deadline.Sub(start) < minBudget:","./internal/redisstore","TestCanceledRoundTripsKeepBreakerClosed"),
    ("86 grants used to their window's end, no margin for drift","internal/redisstore/lease.go","leaseMargin = 2 * time.Millisecond","leaseMargin = 0","./internal/redisstore","TestLeaseMarginCoversDrift"),
    ("87 a refund to the grant does not lower its use","internal/redisstore/lease.go","\t\t\t\tk = min(g.used, hits)\n\t\t\t\tg.used -= k\n","\t\t\t\tk = min(g.used, hits)\n","./internal/redisstore","TestLeaseDoubleRefund"),
    ("88 a refill in a later window keeps the earlier window's hits","internal/redisstore/lease.go","if r.WindowEndUS != g.windowEnd {","if false && r.WindowEndUS != g.windowEnd {","./internal/redisstore","TestLeaseRefillInNextWindow"),
    ("89 idle counters that held a grant never leave the map","internal/redisstore/lease.go","\t\tcase idle:\n","\t\tcase idle && !g.granted:\n","./internal/redisstore","TestLeaseIdleForgotten"),
    ("90 a give-back applied whatever window it names","internal/redisstore/scripts/grant.lua","    elseif gend == we then\n","    else\n","./internal/redisstore","TestGrantGiveBackOtherWindow"),
    ("91 xDS without backoff options reconnects at once","internal/xds/xds.go","if o.BackoffInitial <= 0 {","if o.BackoffInitial < 0 {","./internal/xds","TestBackoffBounds"),
    ("92 xDS waits grow past BackoffMax","internal/xds/xds.go","if o.BackoffMax < o.BackoffInitial {","if o.BackoffMax >= o.BackoffInitial {","./internal/xds","TestBackoffBounds"),
    ("93 xDS headers never sent","internal/xds/xds.go","if len(o.Headers) > 0 {","if len(o.Headers) < 0 {","./internal/xds","TestHeadersSent"),
    ("94 open breaker trials unpaced","internal/redisstore/breaker.go","if now-b.lastTrial.Load() < int64(b.trialEvery) || !b.trial.CompareAndSwap(false, true) {","if now+b.lastTrial.Load() < int64(b.trialEvery) || !b.trial.CompareAndSwap(false, true) {","./internal/redisstore","TestBreakerTrialsPaced"),
    ("95 xDS waits grow past a BackoffMax equal to the first","internal/xds/xds.go","if o.BackoffMax < o.BackoffInitial {","if o.BackoffMax <= o.BackoffInitial {","./internal/xds","TestBackoffBounds"),
    ("96 the xDS stream reopened after each ACK","internal/xds/xds.go","\t\tif err := s.client.Ack(); err != nil {\n\t\t\treturn got, err\n\t\t}\n\t}\n}","\t\tif err := s.client.Ack(); err == nil {\n\t\t\treturn got, err\n\t\t}\n\t}\n}","./internal/xds","TestStream"),
    ("97 a wildcard's star must match at least one byte","config/match.go","if len(s) < len(first)+len(last) ||","if len(s) <= len(first)+len(last) ||","./config","TestWildcardStarsMatchNothing"),
    ("98 descriptors: null refused","config/parse.go","if n == nil || (n.Kind == yaml.ScalarNode && n.Tag == \"!!null\") {","if n == nil || (n.Kind != yaml.ScalarNode && n.Tag == \"!!null\") {","./config","TestGeneratorOutput"),
    ("99 DogStatsD mogrifiers do not rename","internal/compatstats/dogstatsd.go","\t\tn.name = expand(m.Name, groups)\n","\t\tn.name = base\n","./cmd/ratelimitd","TestDogStatsd"),
    ("100 an unresolvable statsd host accepted","internal/compatstats/compatstats.go","if _, err := net.DefaultResolver.LookupHost(ctx, host); err != nil {","if _, err := net.DefaultResolver.LookupHost(ctx, host); err != nil && false {","./internal/compatstats","TestBadSinks"),
    ("101 stats flushed on the request path","internal/compatstats/rules.go","\ts.respTimer.AddValue(ms)\n","\ts.respTimer.AddValue(ms)\n\ts.Flush()\n","./internal/compatstats","TestStuckSink"),
    ("102 stats sink failures not counted","internal/compatstats/compatstats.go","if s.opts.OnSinkError != nil {","if s.opts.OnSinkError != nil && false {","./internal/compatstats","TestStuckSink"),
    ("103 value_to_metric ignored in stat names","internal/compatstats/rules.go","case l.ValueToMetric && (l.Value == \"\" || l.IsWildcard()):","case false && l.ValueToMetric:","./internal/compatstats","TestPaths"),
    ("104 the PromQL check ignores groupings","deploy/promql_test.go","for _, l := range n.Grouping {","for _, l := range n.Grouping[:0] {","./deploy","TestDashboardCheckCatches"),
    ("105 global shadow answers not counted","internal/service/decide.go","\t\t\ts.opts.Compat.GlobalShadow()\n","","./internal/service","TestLocalCacheStats"),
    ("106 RLQS grant lives to its window's end","internal/rlqs/sizing.go","ttl = (reset - s.opts.Margin).Truncate(time.Second)","ttl = reset.Truncate(time.Second)","./internal/rlqs","TestFleetBoundAtWindowEnd"),
    ("107 RLQS fresh bucket without DENY_ALL first","internal/rlqs/sizing.go","\t\t\tif b.sent == sentTokens || b.foreign {\n","\t\t\tif (b.sent == sentTokens || b.foreign) && false {\n","./internal/rlqs","TestFreshBucketEachGrant"),
    ("108 RLQS token bucket refills every second","internal/rlqs/actions.go","FillInterval:  durationpb.New(ttl.Truncate(time.Second) + time.Second),","FillInterval:  durationpb.New(time.Second),","./internal/rlqs","TestFreshBucketEachGrant"),
    ("109 RLQS bucket keyed apart from ShouldRateLimit","internal/service/bucket.go","key := s.counterKey(enc, domain, ents, it)","key := \"rlqs:\" + s.counterKey(enc, domain, ents, it)","./internal/rlqs","TestRLSAndRLQSShareTheLimit"),
    ("110 RLQS failure mode always allow","internal/rlqs/sizing.go","if b.plan.Failure == config.FailureDeny {","if false {","./internal/rlqs","TestFailureMode|TestRedisDown"),
    ("111 RLQS idle buckets kept","internal/rlqs/session.go","if now.Sub(b.lastActive) >= s.opts.IdleAfter {","if false {","./internal/rlqs","TestAbandonIdle"),
    ("112 RLQS streams unbounded","internal/rlqs/session.go","if s.streams >= s.opts.MaxStreams {","if false {","./internal/rlqs","TestBounds"),
    ("113 RLQS streams not stopped at shutdown","internal/server/server.go","\t\tst.Stop()\n","\t\t_ = st\n","./cmd/ratelimitd","TestRLQS$"),
    ("114 check-config silent on short RLQS windows","config/config.go","if w := l.Window(); w < MinRLQSWindow {","if w := l.Window(); w < 0 {","./config","TestRLQSWarnings"),
    ("115 simulated Envoy starts a changed token bucket full","internal/rlqstest/envoy.go","nb.tokens = nb.max * b.tb.tokens / b.tb.max","nb.tokens = nb.max","./internal/rlqstest","TestTokenBucket"),
    ("116 simulated Envoy keeps an assignment without TTL","internal/rlqstest/envoy.go","ttl := time.Duration(a.GetQuotaAssignmentAction().GetAssignmentTimeToLive().GetSeconds()) * time.Second","ttl := time.Duration(max(1, a.GetQuotaAssignmentAction().GetAssignmentTimeToLive().GetSeconds())) * time.Hour","./internal/rlqstest","TestExpiry"),
    ("117 RLQS bucket reported twice granted twice","internal/rlqs/session.go","if !ss.keep(b, now) && !b.needed {","if !ss.keep(b, now) {","./internal/rlqs","TestBucketReportedTwice"),
    ("118 RLQS idle bucket granted as it is abandoned","internal/rlqs/session.go","return ss.buckets[b.key] != b })","return false })","./internal/rlqs","TestIdleNotGranted"),
    ("119 merged domains' rlqs keys may differ","config/merge.go","case !slices.Equal(d.RLQSKeys, o.RLQSKeys):","case false:","./config","TestRLQSMerge"),
    ("120 duplicate rlqs key accepted","config/parse.go","case slices.Contains(keys, k):","case slices.Contains(keys, k) && false:","./config","TestBadConfigs|TestRLQSBad"),
    ("121 memstore grant names no window","internal/memstore/memstore.go","r.WindowEndUS = st.End","r.WindowEndUS = 0","./internal/memstore","TestGrant$"),
    ("122 bucket plan off the rule's limit","internal/service/bucket.go","Limit: it.rpu, WindowUS: it.windowUS, Algorithm","Limit: it.rpu + 1, WindowUS: it.windowUS, Algorithm","./internal/service","TestPlanBucket"),
    ("123 shadow bucket counted","internal/service/bucket.go","case it.shadow || s.opts.ShadowMode:","case false:","./internal/rlqs","TestKinds"),
    ("124 persecond grants all to the main store","internal/persecond/persecond.go","return mainIdx, fastIdx","return append(mainIdx, fastIdx...), nil","./internal/persecond","TestGrantRoutes"),
    ("125 empty token_bucket rule asked at its next token","internal/rlqs/sizing.go","b.wake = now.Add(max(reset, time.Second))","b.wake = now.Add(reset)","./internal/rlqs","TestTokenBucketRule"),
    ("126 RLQS handler never wakes","internal/rlqs/stream.go","wait = max(0, w.Sub(s.opts.Now()))","wait = time.Hour","./internal/rlqs","TestStreamHandler"),
    ("127 simulated Envoy reports no new bucket","internal/rlqstest/envoy.go","e.send(e.report(now, []*bucket{b}))","_ = e.report(now, []*bucket{b})","./internal/rlqstest","TestBasicFlow|TestNoAssignment"),
    ("128 simulated Envoy never reopens its stream","internal/rlqstest/envoy.go","\tif e.conn == nil {\n\t\te.open()","\tif e.conn == nil \u0026\u0026 false {\n\t\te.open()","./internal/rlqstest","TestStreamClosed"),
    ("129 --rlqs-margin 0 accepted","cmd/ratelimitd/flags.go","if err != nil || d <= 0 {","if err != nil || d < 0 {","./cmd/ratelimitd","TestRLQSFlags"),
    ("130 RLQS served without --rlqs","cmd/ratelimitd/run.go","\tif !a.s.rlqsOn {\n\t\treturn nil\n\t}\n","","./cmd/ratelimitd","TestRLQSOff"),
    ("131 simulated Envoy applies requests_per_time_unit","internal/rlqstest/envoy.go","case *typev3.RateLimitStrategy_BlanketRule_, *typev3.RateLimitStrategy_TokenBucket:","case *typev3.RateLimitStrategy_BlanketRule_, *typev3.RateLimitStrategy_TokenBucket, *typev3.RateLimitStrategy_RequestsPerTimeUnit_:","./internal/rlqstest","TestUnsupportedStrategy"),
    ("132 simulated Envoy ignores abandon","internal/rlqstest/envoy.go","\t\t\tdelete(e.buckets, key)\n","\t\t\t_ = key\n","./internal/rlqstest","TestAbandon"),
    ("133 simulated Envoy keeps a closed stream","internal/rlqstest/envoy.go","\t\t\te.conn = nil\n\t\t\tcontinue","\t\t\tcontinue","./internal/rlqs","TestStreamLoss"),
    ("135 script drops a refused usage charge","internal/redisstore/scripts/decide.lua","local consume = (admitted and not o or usage and h > 0) and not refund","local consume = admitted and not o and not refund","./internal/service","TestUsageCharges"),
    ("136 limit.Decide drops a refused usage charge","internal/limit/limit.go","consume := admitted && !results[i].Over && !c.Refund || c.Charge()","consume := admitted && !results[i].Over && !c.Refund","./internal/limit","TestUsageCharged"),
    ("137 script admits budget checks past the flights","internal/redisstore/scripts/decide.lua","o = c >= lim[q] or bs and c + (inflight(bs[3]) + 1) * bs[1] / 1024 > lim[q]","o = c >= lim[q]","./internal/redisstore","TestMatchesMemstore$"),
    ("138 limit.Decide admits budget checks past the flights","internal/limit/limit.go","float64(st.Count)+float64(st.InFlight()+1)*float64(st.Avg)/AvgScale > float64(c.Limit)","false","./internal/limit","TestBudgetChecksInFlight"),
    ("139 local cache answers a usage charge","internal/service/decide.go","if ch.Refund || ch.NoVeto || (ch.Hits == 0) != ch.Usage {","if ch.Refund || ch.NoVeto || ch.Hits == 0 {","./internal/service","TestUsageCharges"),
    ("140 a later store's usage charge given back","internal/limit/order.go","if ch.Refund || ch.Hits == 0 || results[i].Over || ch.Usage {","if ch.Refund || ch.Hits == 0 || results[i].Over {","./internal/persecond","TestUsageAcrossStores"),
    ("141 script ignores calendar periods","internal/redisstore/scripts/decide.lua","if cal > 0 then ws[q], we = calendar(cal) end","if false then ws[q], we = calendar(cal) end","./internal/redisstore","TestCalendarMatchesMemstore"),
    ("142 usage per check dropped at every window","internal/limit/limit.go","avg, k := st.Avg, st.Charges","avg, k := uint64(0), st.Charges*0","./internal/limit","TestBudgetChecksInFlight"),
    ("143 refused budget check goes in flight","internal/limit/limit.go","consume := admitted && !results[i].Over && !c.Refund || c.Charge()","consume := admitted && !results[i].Over && !c.Refund || c.Usage && !c.Refund","./internal/limit","TestBudgetChecksInFlight"),
    ("144 the mapping's old regex: (.*) and a mandatory (\\..*)","internal/compatstats/default_mapper.yaml","rate_limit\\.([^\\.]*)\\.([^\\.]*)\\.([^\\.]*)(\\..*)?\\.near_limit","rate_limit\\.(.*)\\.(.*)\\.(.*)(\\..*)\\.near_limit","./cmd/ratelimitd","TestIncumbentRecorded"),
    ("145 a detailed_metric value keeps its dots","internal/compatstats/rules.go",'seg(&b, e.GetKey(), strings.ReplaceAll(e.GetValue(), ".", "_"))',"seg(&b, e.GetKey(), e.GetValue())","./cmd/ratelimitd","TestIncumbentRecorded"),
    ("146 a refused usage charge's hits taken off the count before it","internal/service/decide.go","				if !over && !cs.read {","				if (!over || ch.Usage) && !cs.read {","./cmd/ratelimitd","TestIncumbentRecorded"),
    ("147 RLQS demand summed at every report, never replaced","internal/rlqs/counters.go","c.rateSum += b.rate - b.contrib","c.rateSum += b.rate","./internal/rlqs","TestShareSteady"),
    ("148 RLQS sliding-window grant sized as a token bucket's","internal/rlqs/sizing.go","windowed := b.plan.Check.Algorithm != limit.TokenBucket","windowed := b.plan.Check.Algorithm == limit.FixedWindow","./internal/rlqs","TestGrantTTLByAlgorithm"),
    ("149 total_hits counted for refunds","internal/service/decide.go","if compat != nil && !it.refund {","if compat != nil {","./cmd/ratelimitd","TestIncumbentStats"),
    ("150 invalid request not a service_error","internal/service/decide.go","\t\ts.m.InvalidRequest()\n\t\ts.opts.Compat.ServiceError()\n","\t\ts.m.InvalidRequest()\n","./cmd/ratelimitd","TestIncumbentStats"),
    ("151 mapping narrowed to three-part keys","internal/compatstats/default_mapper.yaml","([^\\.]*)(\\..*)?\\.total_hits","([^\\.]*)\\.total_hits","./cmd/ratelimitd","TestIncumbentRecorded"),
    ("152 response time observed in ms into a _seconds metric","internal/compatstats/default_mapper.yaml","    scale: 0.001\n","","./internal/compatstats","TestResponseTimeSeconds"),
    ("153 env-compat statsd off by default","internal/envcompat/envcompat.go","statsd := !prom || dog","statsd := dog","./cmd/ratelimitd","TestIncumbentStatsdByDefault"),
    ("154 env-compat OTLP/HTTP default on gRPC's port","internal/envcompat/envcompat.go",'endpoint = "localhost:4318"','endpoint = "localhost:4317"',"./cmd/ratelimitd","TestTracingDefaults"),
    ("155 REDIS_AUTH user:password sent whole as the password","internal/envcompat/envcompat.go","\tif _, pass, ok := strings.Cut(m.res.RedisPassword, \":\"); ok {\n\t\tm.res.RedisPassword = pass\n\t}\n","","./cmd/ratelimitd","TestIncumbentRedisUser"),
    ("156 tracing sampling rate ignored","internal/tracing/tracing.go","sdktrace.TraceIDRatioBased(o.SamplingRate)","sdktrace.AlwaysSample()","./cmd/ratelimitd","TestTracingSamplingRate"),
    ("157 RLQS held tokens revoked by a DENY_ALL when nothing is left","internal/rlqs/sizing.go","\t\t\tif b.holds(now) {\n\t\t\t\t// The Envoy still holds","\t\t\tif false && b.holds(now) {\n\t\t\t\t// The Envoy still holds","./internal/rlqs","TestHeldTokensNotRevoked|TestNoDenyOverHeldTokensAtWindowEnd"),
    ("158 RLQS report past the bucket bound dropped whole","internal/rlqs/session.go","\tusages := msg.GetBucketQuotaUsages()\n","\tusages := msg.GetBucketQuotaUsages()\n\tif len(usages) > s.opts.MaxBuckets {\n\t\treturn nil, nil\n\t}\n","./internal/rlqs","TestBounds"),
    ("159 a near-limit ratio of 1 replaced by the default","internal/compatstats/compatstats.go","opts.NearLimitRatio > 1 {","opts.NearLimitRatio >= 1 {","./internal/compatstats","TestNearLimitRatioAndSanitize"),
    ("160 spaces in a stat path written as _","internal/compatstats/rules.go","r == '|' || r < ' ' ||","r == '|' || r <= ' ' ||","./internal/compatstats","TestNearLimitRatioAndSanitize"),
    ("161 RLQS budget-spent DENY_ALL outliving its window by up to 1.5 s","internal/rlqs/sizing.go","ttl := max(time.Second, (reset+time.Second-1)/time.Second*time.Second)","ttl := max(time.Second, reset.Round(time.Second)+time.Second)","./internal/rlqs","TestFreshBucketEachGrant"),
    ("162 --rejected-hits nothing ignored","internal/service/plan.go","it.usage = it.usage && rejected == config.RejectedUsage","it.usage = it.usage","./internal/service","TestRejectedHitsNothing"),
    ("163 a charge the store could not record counted as refused","internal/service/decide.go","return HitsLost","return HitsRefused","./internal/service","TestUsageLostCounted"),
    ("164 RateLimit-Remaining clamped to the response's uint32","internal/service/headers.go","strconv.FormatUint(remaining(best), 10)","strconv.FormatUint(uint64(st.GetLimitRemaining()), 10)","./internal/service","TestBigBudget"),
    ("165 hits past 2^32 packed with the rule","internal/redisstore/script.go","if hits >= bigHits {","if false {","./internal/service","TestBigBudget"),
    ("166 --calendar-periods ignored","internal/service/plan.go","s.opts.CalendarPeriods && l.CalendarEligible()","false && l.CalendarEligible()","./internal/service","TestCalendarPeriods"),
    ("167 usage per check a mean of every charge, never following","internal/limit/limit.go","st.Charges = min(st.Charges+1, AvgCharges)","st.Charges = st.Charges + 1","./internal/limit","TestUsageMeanFollowsCharges"),
    ("168 a stored state's flights written through","internal/limit/limit.go","\t\tfl := make([]Flight, n, n+1)\n\t\tcopy(fl, st.Flights)","\t\tfl := st.Flights","./internal/limit","TestUsageFlightsNotShared"),
    ("169 diff silent on rejected_hits","cmd/ratelimitd/diff.go","\td.add(\"rejected_hits\", ol.RejectedHits, rl.RejectedHits)\n","","./cmd/ratelimitd","TestDiff"),
    ("170 env-compat tracing over gRPC when no protocol is set (the incumbent's default is http)","internal/envcompat/envcompat.go",'\tif proto == "" {\n\t\tm.set("tracing-protocol", "http")','\tif false {\n\t\tm.set("tracing-protocol", "http")',"./cmd/ratelimitd","TestTracingDefaults|TestTracingHTTPByDefault"),
    ("171 RLQS report counts charged whole to a grant sent after the report before","internal/rlqs/session.go","b.sentAt.After(b.lastReport) && span > 0 {","false && b.sentAt.After(b.lastReport) && span > 0 {","./internal/rlqs","TestFleetBound$"),
    ("172 RLQS grants replaced on a counter that runs out, their tokens lost","internal/rlqs/sizing.go","return d.avail+left < 0.9*b.rate*d.windowLeft.Seconds() && left >= b.rate","return false && d.avail+left < 0.9*b.rate*d.windowLeft.Seconds() && left >= b.rate","./internal/rlqs","TestGrantFollowsDemand|TestFleetBound$|TestFleetBoundAtWindowEnd"),
    ("173 RLQS grants sized to two periods whatever the report phase","internal/rlqs/sizing.go","cl.want = b.rate * (next + ReportPeriod.Seconds())","cl.want = b.rate * (0*next + 2*ReportPeriod.Seconds())","./internal/rlqs","TestFleetBound$|TestFleetBoundAtWindowEnd|TestFleetOverInstances"),
    ("174 RLQS sparse buckets without a spare token","internal/rlqs/sizing.go","\t\t\tcl.want++\n","","./internal/rlqs","TestFleetBound$"),
    ("175 RLQS grant too near the window's end denies over held tokens","internal/rlqs/sizing.go","\t\t\t\tback = append(back, op)\n","\t\t\t\tback = append(back, op)\n\t\t\t\tout = append(out, ss.denyUntil(b, now, reset))\n\t\t\t\tbreak\n","./internal/rlqs","TestNoDenyOverHeldTokensAtWindowEnd"),
    ("176 RLQS first token bucket on a new stream sent over the old one (scaled)","internal/rlqs/sizing.go","if b.sent == sentTokens || b.foreign {","if b.sent == sentTokens {","./internal/rlqs","TestForeignBucket|TestFleetOverInstances"),
    ("177 RLQS foreign bucket granted while what it holds serves it","internal/rlqs/session.go","if now.Before(b.inheritTill) && u.GetNumRequestsDenied() == 0 {","if false {","./internal/rlqs","TestForeignBucket"),
    ("178 RLQS grants blind to the RLS callers' demand","internal/rlqs/sizing.go","rls := max(0, ctr.rlsRate)","rls := 0.0 * max(0, ctr.rlsRate)","./internal/rlqs","TestRLSAndRLQSShareTheLimit"),
    ("179 RLS demand counted as calls, not hits","internal/service/demand.go","Add(max(1, checks[i].Hits))","Add(1)","./internal/service","TestDemandCountsWatched"),
    ("180 RLQS foreign bucket's first report not measured","internal/rlqs/session.go","\t\t\t\t\tb.rate = float64(b.firstCount) / el.Seconds()\n","","./internal/rlqs","TestForeignBucket"),
    ("181 a docs link to a heading that is not there","docs/configuration.md","(rules.md#rules-over-xds)","(rules.md#rules-over-xdz)","./docs","TestLinks"),
    ("182 a nil Tracing's Start dereferences it","internal/tracing/tracing.go","\tif t == nil {\n\t\treturn ctx, trace.SpanFromContext(ctx)\n\t}\n","","./internal/tracing","TestNilTracesNothing"),
    ("183 gostats' variables read from the process, not Options.Getenv","internal/compatstats/compatstats.go","if v := s.opts.Getenv(e.name); v != \"\" {","if v := os.Getenv(e.name); v != \"\" {","./internal/compatstats","TestBadSinks"),
    ("184 an RLQS report reads the rules twice","internal/rlqs/session.go","ss.srv.plan.PlanBucketIn(rules, ss.domain, ents)","ss.srv.plan.PlanBucketIn(ss.srv.plan.Rules(), ss.domain, ents)","./internal/rlqs","TestOneSnapshotPerReport"),
    ("185 the parser accepts a rate_limit field the schema lacks","config/parse.go","\"unit_multiplier\", \"lease\", \"rejected_hits\", \"calendar\"}","\"unit_multiplier\", \"lease\", \"rejected_hits\", \"calendar\", \"jitter\"}","./api","TestSchemaNamesEveryField"),
    ("186 a matched rule's levels shifted by one","config/config.go","for l, j := r, n-1; l != nil && j >= 0; l, j = l.parent, j-1 {","for l, j := r, n-1; l != nil && j > 0; l, j = l.parent, j-1 {","./config","TestLevels"),
    ("187 a rate-limited log line let through within its interval","internal/lograte/lograte.go","if prev != 0 && n-prev < int64(interval) {","if prev != 0 && n-prev < int64(interval)/2 {","./internal/lograte","TestLimiter"),
    ("188 decisions never described on their span","cmd/ratelimitd/run.go","o.Metrics, o.Compat, o.Logger, o.Traced = a.m, a.compat, a.log, a.traces != nil","o.Metrics, o.Compat, o.Logger, o.Traced = a.m, a.compat, a.log, false","./cmd/ratelimitd","TestTracing$|TestTracingSpans|TestTraces"),
    ("189 a request's scratch not cleared before reuse","internal/service/decide.go","\tclear(sc.items)\n\tclear(sc.states)\n","\tclear(sc.items)\n","./internal/service","TestCacheBlocksUntilExactReset"),
    ("134 RLQS token bucket holds more than its grant","internal/rlqs/sizing.go","ss.assign(b, tokens(r.Hits, ttl), ttl, sentTokens)","ss.assign(b, tokens(r.Hits+2, ttl), ttl, sentTokens)","./internal/rlqs","TestFleetBound$|TestFleetOverInstances"),
    ("74 the Prometheus sink gets no counters","internal/compatstats/compatstats.go","\t\t\tf.s.events <- batch // the exporter takes it at once","\t\t\t_ = batch","./cmd/ratelimitd","TestIncumbentStats"),
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
        try:
            r = subprocess.run(['go', 'test', '-count=1', '-timeout=120s', '-run', test, pkg], capture_output=True, text=True, env=env, timeout=300)
            out, failed = r.stdout + r.stderr, r.returncode != 0
        except subprocess.TimeoutExpired:
            out, failed = 'the test did not end within 300 s', True
        status = 'CAUGHT' if failed else 'MISSED'
        missed += status == 'MISSED'
        lines = [l.strip() for l in out.splitlines() if ('_test.go' in l and ':' in l) or 'build failed' in l]
        print(f"{status}: {name} by {test}: {lines[0][:200] if lines else out[-300:]}", flush=True)
    finally:
        open(f, 'w').write(src)
sys.exit(1 if missed else 0)
