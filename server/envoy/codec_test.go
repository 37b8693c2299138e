package envoy

import (
	"math/rand/v2"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// randomString is a string of fewer than n bytes from the k after from,
// each byte one in notUTF8 any byte (now and then not UTF-8).
func randomString(r *rand.Rand, from byte, k, n, notUTF8 int) string {
	b := make([]byte, r.IntN(n))
	for i := range b {
		b[i] = from + byte(r.IntN(k))
		if r.IntN(notUTF8) == 0 {
			b[i] = byte(r.IntN(256))
		}
	}
	return string(b)
}

// randomRequest is a request of random shape: mostly the common one, and
// now and then a descriptor's limit, hits_addend or is_negative_hits, or
// strings that are not UTF-8.
func randomRequest(r *rand.Rand) *rlsv3.RateLimitRequest {
	str := func() string { return randomString(r, 'a', 26, 12, 40) }
	req := &rlsv3.RateLimitRequest{Domain: str(), HitsAddend: uint32(r.IntN(3))}
	for range r.IntN(4) {
		d := &ratelimitv3.RateLimitDescriptor{}
		for range r.IntN(4) {
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: str(), Value: str()})
		}
		switch r.IntN(12) {
		case 0:
			d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_MINUTE}
		case 1:
			d.HitsAddend = wrapperspb.UInt64(uint64(r.IntN(10)))
		case 2:
			d.IsNegativeHits = true
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	return req
}

// TestCodecReadsAsProto holds the hand reading of requests to
// proto.Unmarshal's: on random requests, the same message or an error
// from both; and on the bytes of those requests mutated, the same.
func TestCodecReadsAsProto(t *testing.T) {
	c := newCodec()
	pc := encoding.GetCodecV2("proto")
	r := rand.New(rand.NewPCG(1, 2))
	fast := 0
	for i := range 20000 {
		b, err := proto.Marshal(randomRequest(r))
		if err != nil {
			continue // a string not UTF-8: mutate a valid request instead
		}
		if i%2 == 1 && len(b) > 0 {
			b = append([]byte(nil), b...)
			for range 1 + r.IntN(3) {
				b[r.IntN(len(b))] = byte(r.IntN(256))
			}
		}
		if i%5 == 0 { // the same bytes over several buffers
			b = append(b, protowire.AppendTag(nil, 3, protowire.VarintType)...)
			b = append(b, 7)
		}
		var got, want rlsv3.RateLimitRequest
		errGot := c.Unmarshal(split(b, r), &got)
		errWant := pc.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &want)
		if (errGot == nil) != (errWant == nil) {
			t.Fatalf("bytes %x: error %v, proto's %v", b, errGot, errWant)
		}
		if errGot == nil && !proto.Equal(&got, &want) {
			t.Fatalf("bytes %x: read %v, proto reads %v", b, &got, &want)
		}
		if readRequest(b, &rlsv3.RateLimitRequest{}) {
			fast++
		}
	}
	if fast < 5000 {
		t.Fatalf("only %d requests of 20000 read by hand", fast)
	}
}

// split is b as a BufferSlice of one to three pieces.
func split(b []byte, r *rand.Rand) mem.BufferSlice {
	if len(b) < 2 || r.IntN(2) == 0 {
		return mem.BufferSlice{mem.SliceBuffer(b)}
	}
	i := 1 + r.IntN(len(b)-1)
	return mem.BufferSlice{mem.SliceBuffer(b[:i]), mem.SliceBuffer(b[i:])}
}

// TestCodecWritesAsProto: a response written by the codec reads back as
// the response, every field the service sets included, and big ones go
// through the buffer pool.
func TestCodecWritesAsProto(t *testing.T) {
	c := newCodec()
	meta, err := structpb.NewStruct(map[string]any{"a": "b", "n": 1.5, "l": []any{true, "x"}})
	if err != nil {
		t.Fatal(err)
	}
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			{Code: rlsv3.RateLimitResponse_OK},
			{Code: rlsv3.RateLimitResponse_OVER_LIMIT, LimitRemaining: 3, DurationUntilReset: durationpb.New(1500000000),
				CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: "n", RequestsPerUnit: 10, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE,
					UnitMultiplier: wrapperspb.UInt32(3)}},
		},
		ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "RateLimit", Value: `"default";r=3;t=2`}, {Key: "Retry-After", Value: "2"}},
		DynamicMetadata:      meta,
	}
	for _, n := range []int{1, 200} { // small, then over the pooling threshold
		for len(resp.ResponseHeadersToAdd) < n {
			resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: "x-pad", Value: "0123456789"})
		}
		data, err := c.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		var back rlsv3.RateLimitResponse
		if err := proto.Unmarshal(data.Materialize(), &back); err != nil {
			t.Fatal(err)
		}
		want, _ := proto.MarshalOptions{Deterministic: true}.Marshal(resp)
		if !proto.Equal(&back, resp) || len(want) != data.Len() {
			t.Fatalf("wrote %x, want %x", data.Materialize(), want)
		}
		data.Free()
	}
	// Messages without vtprotobuf's marshalers go to the proto codec.
	data, err := c.Marshal(wrapperspb.String("x"))
	if err != nil || data.Len() != 3 {
		t.Fatal(data, err)
	}
}

// BenchmarkCodec reads a request of two descriptors and writes its
// answer, with the codec and with gRPC's proto codec:
//
//	go test -run '^$' -bench Codec -benchmem ./server/envoy/
func BenchmarkCodec(b *testing.B) {
	ip := &ratelimitv3.RateLimitDescriptor_Entry{Key: "remote_address", Value: "10.1.2.3"}
	req, _ := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{ip}},
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{ip, {Key: "path", Value: "/api/orders"}}},
	}})
	st := func() *rlsv3.RateLimitResponse_DescriptorStatus {
		return &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 999999,
			DurationUntilReset: durationpb.New(1000), CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 1000000, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND}}
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{st(), st()},
		ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "RateLimit-Policy", Value: `"default";q=1000000;w=1`}, {Key: "RateLimit", Value: `"default";r=999999;t=1`}}}
	for _, c := range []encoding.CodecV2{newCodec(), encoding.GetCodecV2("proto")} {
		name := "drip"
		if _, ok := c.(codec); !ok {
			name = "proto"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			data := mem.BufferSlice{mem.SliceBuffer(req)}
			for b.Loop() {
				var r rlsv3.RateLimitRequest
				if err := c.Unmarshal(data, &r); err != nil {
					b.Fatal(err)
				}
				out, err := c.Marshal(resp)
				if err != nil {
					b.Fatal(err)
				}
				out.Free()
			}
		})
	}
}

// TestCodecRefusesOversizedRequests: a request of far more descriptors
// and entries than a call may have is refused before it is decoded, in
// either of the codec's paths (read by hand, or by the proto codec for a
// descriptor with a limit): a 1 MiB message of empty descriptors used to
// take some 46 MiB once decoded, only to be refused by validate. A
// request at the bounds, or a little over them (validate refuses it), is
// read.
func TestCodecRefusesOversizedRequests(t *testing.T) {
	descriptor := func(entries int, limit bool) []byte {
		var d []byte
		for range entries {
			d = protowire.AppendTag(d, 1, protowire.BytesType)
			d = protowire.AppendBytes(d, []byte("\x0a\x01k\x12\x01v"))
		}
		if limit {
			d = protowire.AppendTag(d, 2, protowire.BytesType)
			d = protowire.AppendVarint(d, 0)
		}
		return d
	}
	request := func(descriptors, entries int, limit bool) []byte {
		b := protowire.AppendTag(nil, 1, protowire.BytesType)
		b = protowire.AppendString(b, "d")
		d := descriptor(entries, limit)
		for range descriptors {
			b = protowire.AppendTag(b, 2, protowire.BytesType)
			b = protowire.AppendBytes(b, d)
		}
		return b
	}
	c := newCodec()
	for _, tc := range []struct {
		name string
		msg  []byte
		want string // "" reads it
	}{
		{"at the bounds", request(MaxDescriptors, MaxEntries, false), ""},
		{"at the bounds, with limits", request(MaxDescriptors, MaxEntries, true), ""},
		{"a little over", request(MaxDescriptors+1, MaxEntries+1, false), ""},
		{"many empty descriptors", request(500000, 0, false), "500000 descriptors with 0 entries: at most 64 descriptors of at most 32 entries each"},
		{"many descriptors with limits", request(200000, 0, true), "200000 descriptors with 0 entries: at most 64 descriptors of at most 32 entries each"},
		{"many entries", request(1, 100000, false), "1 descriptors with 100000 entries: at most 64 descriptors of at most 32 entries each"},
		{"many entries beside a limit", request(2, 50000, true), "2 descriptors with 100000 entries: at most 64 descriptors of at most 32 entries each"},
	} {
		var req rlsv3.RateLimitRequest
		err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(tc.msg)}, &req)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || err.Error() != tc.want):
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.want)
		case tc.want != "" && len(req.Descriptors) != 0:
			t.Errorf("%s: %d descriptors decoded", tc.name, len(req.Descriptors))
		}
	}
}

// randomResponse is a response of random shape: mostly the one the
// service builds, and now and then a field written by the proto codec
// (a raw body, dynamic metadata, a quota, a header's raw value) or a
// string that is not UTF-8.
func randomResponse(r *rand.Rand) *rlsv3.RateLimitResponse {
	str := func() string { return randomString(r, ' ', 90, 20, 200) }
	code := func() rlsv3.RateLimitResponse_Code { return rlsv3.RateLimitResponse_Code(r.IntN(3)) }
	big := func() uint32 { return uint32(r.Uint64() >> r.IntN(64)) }
	m := &rlsv3.RateLimitResponse{OverallCode: code()}
	for range r.IntN(4) {
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: code(), LimitRemaining: big()}
		if r.IntN(4) > 0 {
			st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: str(), RequestsPerUnit: big(), Unit: rlsv3.RateLimitResponse_RateLimit_Unit(r.IntN(7))}
			if r.IntN(5) == 0 {
				st.CurrentLimit.UnitMultiplier = wrapperspb.UInt32(big())
			}
		}
		if r.IntN(4) > 0 {
			st.DurationUntilReset = &durationpb.Duration{Seconds: int64(r.Uint64()>>r.IntN(64)) * int64(1-2*r.IntN(2)), Nanos: int32(r.IntN(1e9)) * int32(1-2*r.IntN(2))}
		}
		if r.IntN(50) == 0 {
			st.Quota = &rlsv3.RateLimitResponse_Quota{Requests: 3}
		}
		m.Statuses = append(m.Statuses, st)
	}
	for range r.IntN(5) {
		h := &corev3.HeaderValue{Key: str(), Value: str()}
		if r.IntN(50) == 0 {
			h.RawValue = []byte("raw")
		}
		if r.IntN(2) == 0 {
			m.ResponseHeadersToAdd = append(m.ResponseHeadersToAdd, h)
		} else {
			m.RequestHeadersToAdd = append(m.RequestHeadersToAdd, h)
		}
	}
	switch r.IntN(40) {
	case 0:
		m.RawBody = []byte("body")
	case 1:
		m.DynamicMetadata = &structpb.Struct{}
	case 2:
		m.Quota = &rlsv3.RateLimitResponse_Quota{Requests: 1}
	}
	return m
}

// TestCodecWritesProtoBytes holds the hand writing of responses to
// proto.Marshal's: on random responses, the same bytes or an error from
// both, and most of them written by hand.
func TestCodecWritesProtoBytes(t *testing.T) {
	c := newCodec()
	pc := encoding.GetCodecV2("proto")
	r := rand.New(rand.NewPCG(3, 4))
	hand := 0
	for range 20000 {
		m := randomResponse(r)
		got, errGot := c.Marshal(m)
		want, errWant := pc.Marshal(m)
		if (errGot == nil) != (errWant == nil) {
			t.Fatalf("%v: error %v, proto's %v", m, errGot, errWant)
		}
		if errGot == nil && string(got.Materialize()) != string(want.Materialize()) {
			t.Fatalf("%v: wrote %x, proto writes %x", m, got.Materialize(), want.Materialize())
		}
		if responseSize(m) >= 0 {
			hand++
		}
	}
	if hand < 15000 {
		t.Fatalf("only %d responses of 20000 written by hand", hand)
	}
}
