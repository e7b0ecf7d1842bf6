package dedupe

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"testing"
)

// bodySize is the size of every body canonicalBodies builds: about 1 MiB,
// a large but ordinary request or message.
const bodySize = 1 << 20

// canonicalBodies returns the adversarial bodies the cost of CanonicalJSON
// is measured and bounded on, each about size bytes, beside a flat body of
// the same size (an object of string members, the ordinary shape). wantErr
// says which ones must be refused.
func canonicalBodies(size int) []canonicalBody {
	pad := func(n int) string { return strings.Repeat("x", max(n, 0)) }

	// flat: an object of 1 KiB string members, in reverse key order so
	// that they must be sorted.
	var flat strings.Builder
	flat.WriteByte('{')
	for i := size / 1040; i > 0; i-- {
		if flat.Len() > 1 {
			flat.WriteByte(',')
		}
		fmt.Fprintf(&flat, `"k%06d":"%s"`, i, pad(1024))
	}
	flat.WriteByte('}')

	// deep999: the body of the report, nested 999 levels, its bulk at the
	// bottom; refused at MaxJSONDepth.
	deep999 := strings.Repeat(`{"a":`, 999) + `"` + pad(size-6*999) + `"` + strings.Repeat("}", 999)

	// deepMax: nested as deep as allowed, each level's members out of order
	// so that every level is sorted, its bulk at the bottom (the most a body
	// within the limit can make the sort move).
	deepMax := strings.Repeat(`{"b":`, MaxJSONDepth-1) + `{"b":"` + pad(size-12*MaxJSONDepth) + `","a":1}` + strings.Repeat(`,"a":1}`, MaxJSONDepth-1)

	// wide: an array of small numbers.
	var wide strings.Builder
	wide.WriteByte('[')
	for i := 0; wide.Len() < size-16; i++ {
		if i > 0 {
			wide.WriteByte(',')
		}
		fmt.Fprintf(&wide, "%d", i%10)
	}
	wide.WriteByte(']')

	// longString: one string value, with escapes.
	longString := `{"s":"` + strings.Repeat(`ab\"\u00e9\n`, (size-8)/12) + `"}`

	// manyKeys: one object of short members in reverse order, with escaped
	// keys among them.
	var keys strings.Builder
	keys.WriteByte('{')
	for i := 0; keys.Len() < size-32; i++ {
		if i > 0 {
			keys.WriteByte(',')
		}
		if i%16 == 0 {
			fmt.Fprintf(&keys, `"\u006b%07d":%d`, 9999999-i, i%10)
		} else {
			fmt.Fprintf(&keys, `"k%07d":%d`, 9999999-i, i%10)
		}
	}
	keys.WriteByte('}')

	// expandingKeys: one object whose keys encoding/json writes six times
	// as long (each < as \u003c), in reverse order.
	var expanding strings.Builder
	expanding.WriteByte('{')
	for i := 0; expanding.Len() < size-96; i++ {
		if i > 0 {
			expanding.WriteByte(',')
		}
		fmt.Fprintf(&expanding, `"%s%07d":0`, strings.Repeat("<", 64), 9999999-i)
	}
	expanding.WriteByte('}')

	// smallObjects: an array of small objects, each out of order.
	var small strings.Builder
	small.WriteByte('[')
	for i := 0; small.Len() < size-32; i++ {
		if i > 0 {
			small.WriteByte(',')
		}
		small.WriteString(`{"c":[true,null],"b":{"y":2,"x":1},"a":0}`)
	}
	small.WriteByte(']')

	return []canonicalBody{
		{"flat", flat.String(), false},
		{"deep999", deep999, true},
		{"deepMax", deepMax, false},
		{"wide", wide.String(), false},
		{"longString", longString, false},
		{"manyKeys", keys.String(), false},
		{"expandingKeys", expanding.String(), false},
		{"smallObjects", small.String(), false},
	}
}

type canonicalBody struct {
	name    string
	doc     string
	wantErr bool
}

// BenchmarkCanonicalJSON measures CanonicalJSON on each adversarial body
// beside the flat one of the same size: compare each one's ns/op and B/op
// with flat's.
//
//	go test ./dedupe -run '^$' -bench CanonicalJSON -benchmem
func BenchmarkCanonicalJSON(b *testing.B) {
	for _, body := range canonicalBodies(bodySize) {
		doc := []byte(body.doc)
		b.Run(body.name, func(b *testing.B) {
			b.SetBytes(int64(len(doc)))
			b.ReportAllocs()
			for b.Loop() {
				_, err := CanonicalJSON(doc)
				if (err != nil) != body.wantErr {
					b.Fatalf("error %v, want an error: %v", err, body.wantErr)
				}
			}
		})
	}
}

// BenchmarkCanonicalJSONReference measures the implementation CanonicalJSON
// replaced on the same bodies, for the ratio in one run. deep999 is left
// out: it takes seconds and gigabytes an operation.
//
//	go test ./dedupe -run '^$' -bench CanonicalJSON -benchmem
func BenchmarkCanonicalJSONReference(b *testing.B) {
	for _, body := range canonicalBodies(bodySize) {
		if body.name == "deep999" {
			continue
		}
		doc := []byte(body.doc)
		b.Run(body.name, func(b *testing.B) {
			b.SetBytes(int64(len(doc)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := referenceCanonicalJSON(doc); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestCanonicalJSONCostBounded holds the cost of CanonicalJSON on hostile
// bodies to a small multiple of their size (of the input, or of the
// output, which keys written with escapes can make up to six times
// longer), counted in allocations and bytes allocated rather than time: a
// handful of growing buffers, whatever the shape, where re-decoding every
// level cost a gigabyte for one deep megabyte.
func TestCanonicalJSONCostBounded(t *testing.T) {
	const (
		maxAllocs    = 64 // buffers grown by doubling, and the error
		maxBytesRate = 6  // bytes allocated per byte of input or output
	)
	for _, body := range canonicalBodies(bodySize) {
		doc := []byte(body.doc)
		var err error
		allocs := testing.AllocsPerRun(2, func() { _, err = CanonicalJSON(doc) })
		if (err != nil) != body.wantErr {
			t.Fatalf("%s: error %v, want an error: %v", body.name, err, body.wantErr)
		}
		out, _ := CanonicalJSON(doc)
		size := max(len(doc), len(out))
		bytes := allocatedBy(func() { _, _ = CanonicalJSON(doc) })
		t.Logf("%s: %d bytes in, %d out, %.0f allocations, %d bytes allocated (%.2f per byte in or out)",
			body.name, len(doc), len(out), allocs, bytes, float64(bytes)/float64(size))
		if allocs > maxAllocs {
			t.Errorf("%s: %.0f allocations, want at most %d", body.name, allocs, maxAllocs)
		}
		if bytes > maxBytesRate*uint64(size) {
			t.Errorf("%s: %d bytes allocated for %d bytes in and %d out, want at most %d times the larger", body.name, bytes, len(doc), len(out), maxBytesRate)
		}
	}
}

// allocatedBy returns the fewest bytes the heap grew by over three runs of
// f (the fewest, so that an allocation elsewhere in the process does not
// count).
func allocatedBy(f func()) uint64 {
	least := uint64(math.MaxUint64)
	for range 3 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		f()
		runtime.ReadMemStats(&after)
		least = min(least, after.TotalAlloc-before.TotalAlloc)
	}
	return least
}

// TestCanonicalJSONDepthLimit checks that nesting up to MaxJSONDepth is
// taken and one level more is refused with an error that says so, for
// arrays, objects and a mix of both.
func TestCanonicalJSONDepthLimit(t *testing.T) {
	t.Parallel()
	nest := func(levels int) map[string]string {
		arrays := strings.Repeat("[", levels) + "1" + strings.Repeat("]", levels)
		objects := strings.Repeat(`{"k":`, levels) + "1" + strings.Repeat("}", levels)
		var mixed strings.Builder
		for i := range levels {
			if i%2 == 0 {
				mixed.WriteString(`[0,`)
			} else {
				mixed.WriteString(`{"b":0,"a":`)
			}
		}
		mixed.WriteString("1")
		for i := levels - 1; i >= 0; i-- {
			if i%2 == 0 {
				mixed.WriteString("]")
			} else {
				mixed.WriteString("}")
			}
		}
		return map[string]string{"arrays": arrays, "objects": objects, "mixed": mixed.String()}
	}
	for name, doc := range nest(MaxJSONDepth) {
		if _, err := CanonicalJSON([]byte(doc)); err != nil {
			t.Errorf("%s nested %d levels: %v, want it taken", name, MaxJSONDepth, err)
		}
	}
	for _, levels := range []int{MaxJSONDepth + 1, 999, 100000} {
		for name, doc := range nest(levels) {
			_, err := CanonicalJSON([]byte(doc))
			if !errors.Is(err, errJSONTooDeep) || !strings.Contains(err.Error(), "nested too deep: more than 64 arrays and objects") {
				t.Errorf("%s nested %d levels: %v, want an error for nesting deeper than %d", name, levels, err, MaxJSONDepth)
			}
		}
	}
}
