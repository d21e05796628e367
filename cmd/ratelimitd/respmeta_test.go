package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

// TestIncumbentDynamicMetadata sends the recorded calls of
// envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA
// (testdata/incumbent/dynamic-metadata) in order, under its environment
// with RESPONSE_DYNAMIC_METADATA=true and its rules, and holds each
// answer to the recorded one: the codes, the remaining counts (but in
// refused requests) and the
// dynamic metadata (a limit override's text compared by its fields, as
// protobuf varies its spacing on purpose). The call without descriptors
// is an error, as recorded.
func TestIncumbentDynamicMetadata(t *testing.T) {
	dir := filepath.Join(recordedDir, "dynamic-metadata")
	rules, err := os.ReadFile(filepath.Join(dir, "meta.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	calls, want := readMetadataRecording(t, dir)
	srv := redistest.Start(t)
	redistest.AwayFromWindowEnd(time.Minute, 5*time.Second)
	p := runAsIncumbent(t, map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": srv.Addr(),
		"RUNTIME_ROOT": incumbentRules(t, string(rules)), "RUNTIME_SUBDIRECTORY": "ratelimit", "RESPONSE_DYNAMIC_METADATA": "true"})
	client := rlsv3.NewRateLimitServiceClient(dial(t, p.grpcAddr))
	for i, req := range calls {
		got, err := client.ShouldRateLimit(context.Background(), req)
		w := want[i]
		if w == nil {
			if err == nil {
				t.Errorf("call %d: %v, want an error, as recorded", i+1, got)
			}
			continue
		}
		if err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
		if got.GetOverallCode() != w.GetOverallCode() || len(got.GetStatuses()) != len(w.GetStatuses()) {
			t.Fatalf("call %d: %v, recorded %v", i+1, got, w)
		}
		for j, st := range got.GetStatuses() {
			ws := w.GetStatuses()[j]
			// In a refused request the incumbent consumes the other
			// descriptors' hits, ratelimitd none (docs/migrating.md's
			// differences): their remaining counts differ on purpose.
			refused := w.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT
			if st.GetCode() != ws.GetCode() || !refused && st.GetLimitRemaining() != ws.GetLimitRemaining() {
				t.Errorf("call %d status %d: %v, recorded %v", i+1, j, st, ws)
			}
		}
		gm, wm := limitFields(t, got.GetDynamicMetadata()), limitFields(t, w.GetDynamicMetadata())
		if !proto.Equal(gm, wm) {
			t.Errorf("call %d: dynamic_metadata\n%v\nrecorded\n%v", i+1, protojson.Format(gm), protojson.Format(wm))
		}
	}
}

// readMetadataRecording reads the recorded requests and responses (nil
// for a recorded error).
func readMetadataRecording(t *testing.T, dir string) ([]*rlsv3.RateLimitRequest, []*rlsv3.RateLimitResponse) {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "recording.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var calls []*rlsv3.RateLimitRequest
	var resps []*rlsv3.RateLimitResponse
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "request: "); ok {
			req := &rlsv3.RateLimitRequest{}
			if err := protojson.Unmarshal([]byte(v), req); err != nil {
				t.Fatalf("%s: %v", v, err)
			}
			calls = append(calls, req)
		}
		if v, ok := strings.CutPrefix(line, "response: "); ok {
			if strings.Contains(v, `"error"`) {
				resps = append(resps, nil)
				continue
			}
			resp := &rlsv3.RateLimitResponse{}
			if err := protojson.Unmarshal([]byte(v), resp); err != nil {
				t.Fatalf("%s: %v", v, err)
			}
			resps = append(resps, resp)
		}
	}
	if len(calls) != len(resps) || len(calls) < 14 {
		t.Fatalf("%d requests and %d responses recorded", len(calls), len(resps))
	}
	return calls, resps
}

// limitFields returns md with each descriptor's limit text replaced by
// the override's fields in a canonical text (protobuf varies the spacing
// of its text form on purpose).
func limitFields(t *testing.T, md *structpb.Struct) *structpb.Struct {
	t.Helper()
	md = proto.Clone(md).(*structpb.Struct)
	for _, d := range md.GetFields()["descriptors"].GetListValue().GetValues() {
		f := d.GetStructValue().GetFields()
		if l, ok := f["limit"]; ok {
			o := &rlcommon.RateLimitDescriptor_RateLimitOverride{}
			if err := prototext.Unmarshal([]byte(l.GetStringValue()), o); err != nil {
				t.Fatalf("limit %q: %v", l.GetStringValue(), err)
			}
			f["limit"] = structpb.NewStringValue(fmt.Sprintf("%d/%s", o.GetRequestsPerUnit(), o.GetUnit()))
		}
	}
	return md
}
