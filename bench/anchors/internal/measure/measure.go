// Package measure holds what both Go anchors share with the Rust consumers: the stamps the
// stream server puts in each object, latency percentiles computed the same way as
// bench/support/src/latency.rs, and the JSON result line the harness parses.
//
// Invariants: a latency sample is now − the object's sent stamp at reconcile start; objects
// of the initial list (seq "list") give none; the first `skip` updates are left out;
// percentile q is the sample at index ⌊(n − 1)·q⌋ of the sorted samples. Delivery (the
// offered and delivered rates, the lag's growth) is computed as `Delivery` in
// bench/support/src/latency.rs computes it.
package measure

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"time"
)

const (
	// SentAnnotation holds the Unix nanoseconds at which the server wrote the object.
	SentAnnotation = "bench.wasmctrl.dev/sent-unix-nanos"
	// SeqAnnotation holds the update's index in the watch stream, or "list".
	SeqAnnotation = "bench.wasmctrl.dev/seq"
)

// Sample is one reconcile start: the update it saw, when the server sent it and when the
// reconcile started (Unix nanoseconds), and the difference.
type Sample struct {
	Seq   uint64
	Sent  uint64
	At    uint64
	Nanos uint64
}

// FromAnnotations reads a sample at now; ok is false for listed objects or missing stamps.
func FromAnnotations(annotations map[string]string, now time.Time) (Sample, bool) {
	seq, err := strconv.ParseUint(annotations[SeqAnnotation], 10, 64)
	if err != nil {
		return Sample{}, false
	}
	sent, err := strconv.ParseUint(annotations[SentAnnotation], 10, 64)
	if err != nil {
		return Sample{}, false
	}
	n := uint64(now.UnixNano())
	if n < sent {
		n = sent
	}
	return Sample{Seq: seq, Sent: sent, At: n, Nanos: n - sent}, true
}

// Delivery reports, over the samples with Seq >= skip: the rate the server sent updates at
// (seq span over sent-stamp span), the rate the consumer reconciled them at (seq span from
// its first to its last reconcile, over the time between them), and the median lag of the
// first and last third of those samples (by seq), in ms. Empty with fewer than 3 samples.
func Delivery(samples []Sample, skip uint64) map[string]any {
	kept := make([]Sample, 0, len(samples))
	for _, s := range samples {
		if s.Seq >= skip {
			kept = append(kept, s)
		}
	}
	if len(kept) < 3 {
		return map[string]any{}
	}
	bySeq := append([]Sample(nil), kept...)
	sort.Slice(bySeq, func(i, j int) bool { return bySeq[i].Seq < bySeq[j].Seq })
	byAt := kept
	sort.Slice(byAt, func(i, j int) bool { return byAt[i].At < byAt[j].At })
	rate := func(seqs float64, nanos uint64) float64 {
		if nanos == 0 {
			return 0
		}
		return seqs / (float64(nanos) / 1e9)
	}
	first, last := bySeq[0], bySeq[len(bySeq)-1]
	offered := rate(float64(last.Seq-first.Seq), last.Sent-first.Sent)
	a, b := byAt[0], byAt[len(byAt)-1]
	delivered := rate(float64(int64(b.Seq)-int64(a.Seq)), b.At-a.At)
	third := len(bySeq) / 3
	median := func(part []Sample) float64 {
		nanos := make([]uint64, len(part))
		for i, s := range part {
			nanos[i] = s.Nanos
		}
		sort.Slice(nanos, func(i, j int) bool { return nanos[i] < nanos[j] })
		return float64(nanos[(len(nanos)-1)/2]) / 1e6
	}
	return map[string]any{
		"offered_per_sec":    offered,
		"delivered_per_sec":  delivered,
		"lag_first_third_ms": median(bySeq[:third]),
		"lag_last_third_ms":  median(bySeq[len(bySeq)-third:]),
	}
}

// Percentiles are in nanoseconds.
type Percentiles struct {
	Count int
	P50   uint64
	P99   uint64
	Max   uint64
}

// Compute returns the percentiles of the samples with Seq >= skip; ok is false if none.
func Compute(samples []Sample, skip uint64) (Percentiles, bool) {
	nanos := make([]uint64, 0, len(samples))
	for _, s := range samples {
		if s.Seq >= skip {
			nanos = append(nanos, s.Nanos)
		}
	}
	if len(nanos) == 0 {
		return Percentiles{}, false
	}
	sort.Slice(nanos, func(i, j int) bool { return nanos[i] < nanos[j] })
	pick := func(q float64) uint64 { return nanos[int(float64(len(nanos)-1)*q)] }
	return Percentiles{Count: len(nanos), P50: pick(0.5), P99: pick(0.99), Max: pick(1.0)}, true
}

// Emit prints one JSON result line on stdout.
func Emit(result map[string]any) {
	line, err := json.Marshal(result)
	if err != nil {
		Fail(fmt.Errorf("encoding the result: %w", err))
	}
	fmt.Println(string(line))
}

// Fail prints an error line the harness reports, and exits non-zero.
func Fail(err error) {
	line, _ := json.Marshal(map[string]any{"error": err.Error()})
	fmt.Println(string(line))
	os.Exit(1)
}
