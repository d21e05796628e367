//go:build vtprotobuf

package server

import rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

// generatedEncoder tells the tests which encoder this build has.
const generatedEncoder = true

// encodeGenerated writes resp with go-control-plane's vtprotobuf code,
// fields in number order as proto.Marshal writes them (the Strict
// variant).
func encodeGenerated(resp *rlsv3.RateLimitResponse) ([]byte, bool) {
	b := make([]byte, resp.SizeVT())
	n, err := resp.MarshalToSizedBufferVTStrict(b)
	if err != nil {
		return nil, false
	}
	// The buffer is written from its end.
	return b[len(b)-n:], true
}
