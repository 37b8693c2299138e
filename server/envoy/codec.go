package envoy

import (
	"fmt"
	"unicode/utf8"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // the codec this one falls back on
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// codec is the gRPC codec of the rate limit server (grpc.ForceServerCodecV2:
// that server's calls only, never the process's other gRPC clients and
// servers). It reads and writes the same bytes as gRPC's proto codec, for
// less CPU per call:
//
//   - A message with vtprotobuf's marshalers (go-control-plane generates
//     them for RateLimitResponse and what it holds) is sized and written
//     by them, into a buffer of gRPC's shared pool, without reflection.
//   - A RateLimitRequest of the common shape (a domain, descriptors of
//     entries, hits_addend) is read by hand, its strings cut from one copy
//     of the message and its descriptors and entries allocated together;
//     a request holding anything else (a descriptor's limit, hits_addend
//     or is_negative_hits, an unknown field) or anything proto.Unmarshal
//     would refuse is read by the proto codec, as before.
//
// Everything else goes to the proto codec.
type codec struct{ proto encoding.CodecV2 }

func newCodec() codec { return codec{proto: encoding.GetCodecV2("proto")} }

func (codec) Name() string { return "proto" }

type vtMarshaler interface {
	SizeVT() int
	MarshalToSizedBufferVTStrict([]byte) (int, error)
}

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(vtMarshaler)
	if !ok {
		return c.proto.Marshal(v)
	}
	size := m.SizeVT()
	if mem.IsBelowBufferPoolingThreshold(size) {
		buf := make([]byte, size)
		if _, err := m.MarshalToSizedBufferVTStrict(buf); err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(buf)}, nil
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size)
	if _, err := m.MarshalToSizedBufferVTStrict(*buf); err != nil {
		pool.Put(buf)
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	if req, ok := v.(*rlsv3.RateLimitRequest); ok {
		var b []byte
		if len(data) == 1 {
			b = data[0].ReadOnlyData()
		} else {
			b = data.Materialize()
		}
		if err := bounds(b); err != nil {
			return err
		}
		if readRequest(b, req) {
			return nil
		}
	}
	return c.proto.Unmarshal(data, v)
}

// maxDecoded bounds the descriptors and entries, together, of a
// RateLimitRequest the codec decodes: four times the most a valid call
// may have (MaxDescriptors of MaxEntries). A descriptor or an entry takes
// 2 bytes of a message and about 80 once decoded, so a 1 MiB message of
// them would otherwise take some 40 MiB of memory only to be refused by
// validate. A request with more is refused before it is decoded; one
// with fewer is decoded, and validate refuses it with InvalidArgument.
const maxDecoded = 4 * MaxDescriptors * (MaxEntries + 1)

// bounds refuses a RateLimitRequest of more than maxDecoded descriptors
// and entries. Bytes that are not a message are left to the decoder.
func bounds(b []byte) error {
	nd, ne := 0, 0
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil
		}
		b = b[n:]
		if num != 2 || typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return nil
			}
			b = b[n:]
			continue
		}
		d, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return nil
		}
		b = b[n:]
		nd++
		ne += countFields(d, 1)
	}
	if nd+ne > maxDecoded {
		return fmt.Errorf("%d descriptors with %d entries: at most %d descriptors of at most %d entries each", nd, ne, MaxDescriptors, MaxEntries)
	}
	return nil
}

// countFields counts the fields numbered num in the message b, up to the
// first bytes that are not one.
func countFields(b []byte, num protowire.Number) int {
	k := 0
	for len(b) > 0 {
		fn, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return k
		}
		b = b[n:]
		if n = protowire.ConsumeFieldValue(fn, typ, b); n < 0 {
			return k
		}
		b = b[n:]
		if fn == num {
			k++
		}
	}
	return k
}

// readRequest reads b into req (which must be empty) when b is a
// RateLimitRequest of the common shape, and reports whether it did; when
// it did not, req is untouched.
func readRequest(b []byte, req *rlsv3.RateLimitRequest) bool {
	// First pass: check the shape, count descriptors and entries.
	nd, ne := 0, 0
	for rest := b; len(rest) > 0; {
		num, typ, n := protowire.ConsumeTag(rest)
		if n < 0 {
			return false
		}
		rest = rest[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(rest)
			if n < 0 || !utf8.Valid(v) {
				return false
			}
			rest = rest[n:]
		case num == 2 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(rest)
			if n < 0 {
				return false
			}
			rest = rest[n:]
			k, ok := countEntries(v)
			if !ok {
				return false
			}
			nd++
			ne += k
		case num == 3 && typ == protowire.VarintType:
			_, n := protowire.ConsumeVarint(rest)
			if n < 0 {
				return false
			}
			rest = rest[n:]
		default:
			return false
		}
	}
	// Second pass: build, every string a piece of one copy of b.
	s := string(b)
	var ds []ratelimitv3.RateLimitDescriptor
	var dps []*ratelimitv3.RateLimitDescriptor
	var es []ratelimitv3.RateLimitDescriptor_Entry
	var eps []*ratelimitv3.RateLimitDescriptor_Entry
	if nd > 0 {
		ds = make([]ratelimitv3.RateLimitDescriptor, nd)
		dps = make([]*ratelimitv3.RateLimitDescriptor, nd)
	}
	if ne > 0 {
		es = make([]ratelimitv3.RateLimitDescriptor_Entry, ne)
		eps = make([]*ratelimitv3.RateLimitDescriptor_Entry, ne)
	}
	off := 0 // of rest in s
	di, ei := 0, 0
	for rest := b; len(rest) > 0; {
		num, _, n := protowire.ConsumeTag(rest)
		rest, off = rest[n:], off+n
		switch num {
		case 1:
			v, n := protowire.ConsumeBytes(rest)
			start := off + n - len(v)
			req.Domain = s[start : start+len(v)]
			rest, off = rest[n:], off+n
		case 2:
			v, n := protowire.ConsumeBytes(rest)
			base := off + n - len(v)
			d := &ds[di]
			dps[di] = d
			di++
			first := ei
			for r, o := v, base; len(r) > 0; {
				_, _, tn := protowire.ConsumeTag(r)
				r, o = r[tn:], o+tn
				ev, en := protowire.ConsumeBytes(r)
				e := &es[ei]
				eps[ei] = e
				ei++
				readEntry(s, ev, o+en-len(ev), e)
				r, o = r[en:], o+en
			}
			if ei > first {
				d.Entries = eps[first:ei:ei]
			}
			rest, off = rest[n:], off+n
		case 3:
			x, n := protowire.ConsumeVarint(rest)
			req.HitsAddend = uint32(x)
			rest, off = rest[n:], off+n
		}
	}
	req.Descriptors = dps
	return true
}

// countEntries checks that b is a RateLimitDescriptor of entries only,
// each entry of a key and a value only, in valid UTF-8, and counts them.
func countEntries(b []byte) (int, bool) {
	k := 0
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num != 1 || typ != protowire.BytesType {
			return 0, false
		}
		b = b[n:]
		e, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return 0, false
		}
		b = b[n:]
		for len(e) > 0 {
			num, typ, n := protowire.ConsumeTag(e)
			if n < 0 || (num != 1 && num != 2) || typ != protowire.BytesType {
				return 0, false
			}
			e = e[n:]
			v, n := protowire.ConsumeBytes(e)
			if n < 0 || !utf8.Valid(v) {
				return 0, false
			}
			e = e[n:]
		}
		k++
	}
	return k, true
}

// readEntry reads an entry checked by countEntries, at offset off of s.
func readEntry(s string, b []byte, off int, e *ratelimitv3.RateLimitDescriptor_Entry) {
	for len(b) > 0 {
		num, _, n := protowire.ConsumeTag(b)
		b, off = b[n:], off+n
		v, n := protowire.ConsumeBytes(b)
		start := off + n - len(v)
		if num == 1 {
			e.Key = s[start : start+len(v)]
		} else {
			e.Value = s[start : start+len(v)]
		}
		b, off = b[n:], off+n
	}
}
