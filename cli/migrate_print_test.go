package cli_test

import (
	"strings"
	"testing"
)

// A table or schema name that would end a -- comment of the printed
// script and start a statement of its own is refused, and nothing is
// printed.
func TestMigratePrintRefusesUnprintableNames(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const drop = "\nDROP TABLE effects; --"
	for _, args := range [][]string{
		{"--parked-table", "parked" + drop},
		{"--schema", "ops" + drop},
		{"--kafka", "--offsets-table", "offsets\r" + drop},
		{"--no-parked", "--markers-table", "processed" + drop},
	} {
		r, err := e.run(stock, "", append([]string{"migrate", "--print"}, args...)...)
		if err == nil || !strings.Contains(err.Error(), "U+000") {
			t.Errorf("migrate --print %q: %v, want an error naming the control character", args, err)
		}
		if strings.Contains(r.out, "DROP TABLE effects") {
			t.Errorf("migrate --print %q printed:\n%s", args, r.out)
		}
	}
	if e.count(`SELECT count(*) FROM pg_tables WHERE tablename = 'effects'`) != 1 {
		t.Fatal("the effects table is gone")
	}
}
