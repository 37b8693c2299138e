package simulate

import (
	"cmp"
	"slices"
	"time"
)

// thinner keeps, of the samples of each step of time, the first, the
// lowest and the highest, in the order they came: enough to draw the
// envelope of a sawtooth faithfully at any zoom, in bounded memory.
type thinner struct {
	step time.Duration
	out  []Sample
	cur  int64
	n    int
	bin  []seqSample // first, min, max of the current step
}

type seqSample struct {
	Sample
	seq int
}

func (t *thinner) add(s Sample) {
	b := int64(s.At / t.step)
	if len(t.bin) > 0 && b != t.cur {
		t.flush()
	}
	t.cur = b
	t.n++
	x := seqSample{s, t.n}
	switch {
	case len(t.bin) == 0:
		t.bin = append(t.bin, x, x, x)
	case s.Tokens < t.bin[1].Tokens:
		t.bin[1] = x
	case s.Tokens > t.bin[2].Tokens:
		t.bin[2] = x
	}
}

func (t *thinner) flush() {
	slices.SortFunc(t.bin, func(a, b seqSample) int { return cmp.Compare(a.seq, b.seq) })
	for i, x := range t.bin {
		if i == 0 || x.seq != t.bin[i-1].seq {
			t.out = append(t.out, x.Sample)
		}
	}
	t.bin = t.bin[:0]
}

func (t *thinner) done() []Sample {
	if len(t.bin) > 0 {
		t.flush()
	}
	return t.out
}

// niceDuration is the smallest "round" duration at least d: 1, 2 or 5
// times a power of ten below a second, then 1s, 2s, 5s, 10s, 15s, 30s, 1m,
// 2m, 5m, 10m, 15m, 30m, 1h, 2h, 3h, 6h, 12h, then whole days (1, 2, 5
// times a power of ten).
func niceDuration(d time.Duration) time.Duration {
	if d <= time.Millisecond {
		return time.Millisecond
	}
	for _, s := range []time.Duration{
		2 * time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond,
		50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond,
		time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 15 * time.Second, 30 * time.Second,
		time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute, 30 * time.Minute,
		time.Hour, 2 * time.Hour, 3 * time.Hour, 6 * time.Hour, 12 * time.Hour,
	} {
		if d <= s {
			return s
		}
	}
	day := 24 * time.Hour
	for m := time.Duration(1); ; m *= 10 {
		for _, k := range []time.Duration{1, 2, 5} {
			if d <= k*m*day {
				return k * m * day
			}
		}
	}
}
