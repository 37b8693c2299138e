package envoy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
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
//   - A RateLimitResponse of the shape the service builds is sized and
//     written by hand (appendResponse), into a buffer of gRPC's shared
//     pool when it is big enough, without reflection; so is a message
//     with vtprotobuf's marshalers (go-control-plane's, in a build with
//     the vtprotobuf tag).
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
	if m, ok := v.(*rlsv3.RateLimitResponse); ok {
		if size := responseSize(m); size >= 0 {
			return written(size, func(b []byte) error {
				appendResponse(b[:0], m)
				return nil
			})
		}
	}
	m, ok := v.(vtMarshaler)
	if !ok {
		return c.proto.Marshal(v)
	}
	return written(m.SizeVT(), func(b []byte) error {
		_, err := m.MarshalToSizedBufferVTStrict(b)
		return err
	})
}

// written is a message of size bytes written by write into a buffer of
// exactly that size: of gRPC's shared pool when it is big enough to pool.
func written(size int, write func([]byte) error) (mem.BufferSlice, error) {
	if mem.IsBelowBufferPoolingThreshold(size) {
		buf := make([]byte, size)
		if err := write(buf); err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(buf)}, nil
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size)
	if err := write(*buf); err != nil {
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
	return decodable(nd, ne)
}

// decodable refuses nd descriptors with ne entries, together, past
// maxDecoded.
func decodable(nd, ne int) error {
	if nd+ne > maxDecoded {
		return fmt.Errorf("%d descriptors with %d entries: at most %d descriptors of at most %d entries each", nd, ne, MaxDescriptors, MaxEntries)
	}
	return nil
}

// JSONBounds is the codec's bound (maxDecoded) for a RateLimitRequest in
// protojson's form (envoyproxy/ratelimit's POST /json), checked before
// protojson decodes it: an empty descriptor is 3 bytes of JSON and some
// 80 once decoded. It counts the elements of "descriptors" and of their
// "entries" token by token, keeping none; JSON that is not of that shape
// is left to protojson once what it counted is within the bound.
func JSONBounds(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	nd, ne := 0, 0
	jsonObject(dec, func(k string) error {
		if k != "descriptors" {
			return jsonSkip(dec)
		}
		return jsonArray(dec, func() error {
			nd++
			return jsonObject(dec, func(k string) error {
				if k != "entries" {
					return jsonSkip(dec)
				}
				return jsonArray(dec, func() error {
					ne++
					return jsonSkip(dec)
				})
			})
		})
	})
	return decodable(nd, ne)
}

// errShape stops JSONBounds at JSON it does not count.
var errShape = errors.New("not of a RateLimitRequest's shape")

// jsonObject reads an object (or null) from dec, calling f after each
// key to read its value.
func jsonObject(dec *json.Decoder, f func(key string) error) error {
	return jsonEach(dec, '{', '}', func() error {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		k, ok := t.(string)
		if !ok {
			return errShape
		}
		return f(k)
	})
}

// jsonArray reads an array (or null) from dec, calling f to read each
// element.
func jsonArray(dec *json.Decoder, f func() error) error {
	return jsonEach(dec, '[', ']', f)
}

func jsonEach(dec *json.Decoder, open, end json.Delim, f func() error) error {
	t, err := dec.Token()
	if err != nil || t == nil {
		return err
	}
	if t != open {
		return errShape
	}
	for dec.More() {
		if err := f(); err != nil {
			return err
		}
	}
	t, err = dec.Token()
	if err == nil && t != end {
		return errShape
	}
	return err
}

// jsonSkip reads one value from dec.
func jsonSkip(dec *json.Decoder) error {
	for depth := 0; ; {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		switch t {
		case json.Delim('{'), json.Delim('['):
			depth++
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
		if depth <= 0 {
			return nil
		}
	}
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

// The hand writing of a RateLimitResponse of the shape respond builds: an
// overall code, statuses (a code, the current limit, the remaining, the
// duration until reset) and headers to add. It writes what proto.Marshal
// writes (the fields in the order of their numbers, zeros left out); a
// response holding anything else (a raw body, dynamic metadata, a quota,
// a header's raw value, a nil element, unknown fields) or a string that
// is not UTF-8 (which proto.Marshal refuses) goes to the proto codec.
// (go-control-plane's vtprotobuf marshalers are built only with the
// vtprotobuf build tag, which a module cannot set for those who build it.)

// responseSize is the size of m written by hand, or -1 when m is not of
// the shape written by hand.
func responseSize(m *rlsv3.RateLimitResponse) int {
	if m.RawBody != nil || m.DynamicMetadata != nil || m.Quota != nil || len(m.ProtoReflect().GetUnknown()) > 0 {
		return -1
	}
	n := varintSize(1, uint64(int64(m.OverallCode)))
	for _, st := range m.Statuses {
		k := statusSize(st)
		if k < 0 {
			return -1
		}
		n += fieldSize(2, k)
	}
	for _, hs := range [][]*corev3.HeaderValue{m.ResponseHeadersToAdd, m.RequestHeadersToAdd} {
		for _, h := range hs {
			k := headerSize(h)
			if k < 0 {
				return -1
			}
			n += fieldSize(3, k) // 3 and 4 have tags of one byte
		}
	}
	return n
}

func statusSize(st *rlsv3.RateLimitResponse_DescriptorStatus) int {
	if st == nil || st.Quota != nil || len(st.ProtoReflect().GetUnknown()) > 0 {
		return -1
	}
	n := varintSize(1, uint64(int64(st.Code))) + varintSize(3, uint64(st.LimitRemaining))
	if l := st.CurrentLimit; l != nil {
		k := limitSize(l)
		if k < 0 {
			return -1
		}
		n += fieldSize(2, k)
	}
	if d := st.DurationUntilReset; d != nil {
		if len(d.ProtoReflect().GetUnknown()) > 0 {
			return -1
		}
		n += fieldSize(4, durationSize(d.Seconds, d.Nanos))
	}
	return n
}

func limitSize(l *rlsv3.RateLimitResponse_RateLimit) int {
	if len(l.ProtoReflect().GetUnknown()) > 0 || !utf8.ValidString(l.Name) {
		return -1
	}
	n := varintSize(1, uint64(l.RequestsPerUnit)) + varintSize(2, uint64(int64(l.Unit))) + stringSize(3, l.Name)
	if u := l.UnitMultiplier; u != nil {
		if len(u.ProtoReflect().GetUnknown()) > 0 {
			return -1
		}
		n += fieldSize(4, varintSize(1, uint64(u.Value)))
	}
	return n
}

func headerSize(h *corev3.HeaderValue) int {
	if h == nil || len(h.RawValue) > 0 || len(h.ProtoReflect().GetUnknown()) > 0 || !utf8.ValidString(h.Key) || !utf8.ValidString(h.Value) {
		return -1
	}
	return stringSize(1, h.Key) + stringSize(2, h.Value)
}

func durationSize(s int64, ns int32) int {
	return varintSize(1, uint64(s)) + varintSize(2, uint64(int64(ns)))
}

// varintSize, stringSize and fieldSize are the sizes of a field of a
// varint (left out when zero), of a string (left out when empty) and of
// a message of n bytes, all of field numbers below 16 (tags of one byte).
func varintSize(_ protowire.Number, v uint64) int {
	if v == 0 {
		return 0
	}
	return 1 + protowire.SizeVarint(v)
}

func stringSize(_ protowire.Number, s string) int {
	if s == "" {
		return 0
	}
	return 1 + protowire.SizeBytes(len(s))
}

func fieldSize(_ protowire.Number, n int) int { return 1 + protowire.SizeBytes(n) }

// appendResponse appends m, checked by responseSize, as proto.Marshal
// writes it.
func appendResponse(b []byte, m *rlsv3.RateLimitResponse) []byte {
	b = appendVarint(b, 1, uint64(int64(m.OverallCode)))
	for _, st := range m.Statuses {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(statusSize(st)))
		b = appendVarint(b, 1, uint64(int64(st.Code)))
		if l := st.CurrentLimit; l != nil {
			b = protowire.AppendTag(b, 2, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(limitSize(l)))
			b = appendVarint(b, 1, uint64(l.RequestsPerUnit))
			b = appendVarint(b, 2, uint64(int64(l.Unit)))
			b = appendString(b, 3, l.Name)
			if u := l.UnitMultiplier; u != nil {
				b = protowire.AppendTag(b, 4, protowire.BytesType)
				b = protowire.AppendVarint(b, uint64(varintSize(1, uint64(u.Value))))
				b = appendVarint(b, 1, uint64(u.Value))
			}
		}
		b = appendVarint(b, 3, uint64(st.LimitRemaining))
		if d := st.DurationUntilReset; d != nil {
			b = protowire.AppendTag(b, 4, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(durationSize(d.Seconds, d.Nanos)))
			b = appendVarint(b, 1, uint64(d.Seconds))
			b = appendVarint(b, 2, uint64(int64(d.Nanos)))
		}
	}
	for num, hs := range [][]*corev3.HeaderValue{m.ResponseHeadersToAdd, m.RequestHeadersToAdd} {
		for _, h := range hs {
			b = protowire.AppendTag(b, protowire.Number(3+num), protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(headerSize(h)))
			b = appendString(b, 1, h.Key)
			b = appendString(b, 2, h.Value)
		}
	}
	return b
}

func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), s)
}
