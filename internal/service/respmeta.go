package service

import (
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/types/known/structpb"
)

// dynamicMetadata is a response's dynamic_metadata: the incumbent's
// fields (ResponseMetadata) and the decisions (DecisionMetadata, reasons)
// side by side, or nil.
func (s *Service) dynamicMetadata(req *rlsv3.RateLimitRequest, items []item, statuses []*rlsv3.RateLimitResponse_DescriptorStatus, reasons []any) *structpb.Struct {
	var md *structpb.Struct
	if s.opts.ResponseMetadata {
		md = incumbentMetadata(req, items, statuses)
	}
	if reasons != nil {
		if list, err := structpb.NewList(reasons); err == nil {
			if md == nil {
				md = &structpb.Struct{Fields: map[string]*structpb.Value{}}
			}
			md.Fields["decisions"] = structpb.NewListValue(list)
		}
	}
	return md
}

// incumbentMetadata is envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA
// answer, as its recording shows it (docs/migrating.md):
//
//	{domain, descriptors: [{entries: ["k=v", ...], hitsAddend?, limit?}, ...],
//	 hitsAddend?, metadata?}
//
// a descriptor's hitsAddend when it sets one, its limit override as
// protobuf text, the request's hitsAddend when not 0, and metadata the
// rules' metadata of the descriptors answered OK merged in request order,
// the first descriptor's value of a key winning (left out when empty).
// Envoy AI Gateway's quota-aware routing reads it.
func incumbentMetadata(req *rlsv3.RateLimitRequest, items []item, statuses []*rlsv3.RateLimitResponse_DescriptorStatus) *structpb.Struct {
	descs := req.GetDescriptors()
	list := make([]*structpb.Value, len(descs))
	var merged map[string]*structpb.Value
	for i, d := range descs {
		ents := make([]*structpb.Value, len(d.GetEntries()))
		for j, e := range d.GetEntries() {
			ents[j] = structpb.NewStringValue(e.GetKey() + "=" + e.GetValue())
		}
		f := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: ents})}
		if h := d.GetHitsAddend(); h != nil {
			f["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
		}
		if l := d.GetLimit(); l != nil {
			f["limit"] = structpb.NewStringValue(prototext.MarshalOptions{}.Format(l))
		}
		list[i] = structpb.NewStructValue(&structpb.Struct{Fields: f})
		if r := items[i].rule; r != nil && r.Metadata != nil && statuses[i].GetCode() == rlsv3.RateLimitResponse_OK {
			if merged == nil {
				merged = make(map[string]*structpb.Value, len(r.Metadata.GetFields()))
			}
			for k, v := range r.Metadata.GetFields() {
				if _, ok := merged[k]; !ok {
					merged[k] = v
				}
			}
		}
	}
	out := map[string]*structpb.Value{
		"domain":      structpb.NewStringValue(req.GetDomain()),
		"descriptors": structpb.NewListValue(&structpb.ListValue{Values: list}),
	}
	if h := req.GetHitsAddend(); h != 0 {
		out["hitsAddend"] = structpb.NewNumberValue(float64(h))
	}
	if len(merged) > 0 {
		out["metadata"] = structpb.NewStructValue(&structpb.Struct{Fields: merged})
	}
	return &structpb.Struct{Fields: out}
}
