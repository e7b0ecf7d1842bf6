package consumer_test

import (
	"context"
	"io/fs"
	"testing"
	"testing/fstest"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/pg"
)

// A parked table made by the first migration, with rows in it, is upgraded
// by the second: the rows keep working (listed, redriven exactly as before),
// and a new message under the ref of an old row gets a row of its own.
func TestParkedMigrationUpgradesExistingRows(t *testing.T) {
	t.Parallel()
	e := newEnv(t, consumertest.Config{})
	ctx := context.Background()
	line := parked.Line("", "")
	first, err := fs.ReadFile(line.FS, "001_parked.sql")
	if err != nil {
		t.Fatal(err)
	}
	old := line
	old.FS = fstest.MapFS{"001_parked.sql": {Data: first}}
	if _, err := pg.Migrate(ctx, e.pool, "", old); err != nil {
		t.Fatal(err)
	}
	// Rows as the earlier version wrote them: refs cleaned to text, a nil
	// payload stored empty.
	if _, err := e.pool.Exec(ctx, `INSERT INTO effectively.parked (consumer, scope, dedupe_id, has_marker, source, lane, ref,
    msg_key, payload, headers, attempts, reason, last_error, parked_at)
VALUES ('test', 'test', NULL, false, 'script', 'script-0', 'r'||chr(65533), NULL, '\x6f6c64', '[{"key":"h","value":"v"}]', 1, 'invalid_key', 'no key', now() - interval '1 hour'),
       ('test', 'test', 'id-1', true, 'script', 'script-0', 'orders/0@1', 'k', '', '[]', 3, 'max_attempts', 'boom', now() - interval '1 hour')`); err != nil {
		t.Fatal(err)
	}

	s := newScript([]consumer.Message{keyless("r\uFFFD", "new"), keyless("r\uFFFD", "new")})
	e.runScript(s, consumer.Config{}) // applies the second migration
	var n, nullBytes, counts int
	if err := e.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE ref_bytes IS NULL OR last_parked_at IS NULL), sum(park_count)
FROM effectively.parked`).Scan(&n, &nullBytes, &counts); err != nil {
		t.Fatal(err)
	}
	if n != 3 || nullBytes != 0 || counts != 4 {
		t.Fatalf("%d rows (%d without ref_bytes or last_parked_at), counts summing to %d; want 3 rows, none, 4", n, nullBytes, counts)
	}
	var oldRef []byte
	var sameTime bool
	if err := e.pool.QueryRow(ctx, `SELECT ref_bytes, last_parked_at = parked_at FROM effectively.parked WHERE id = 1`).Scan(&oldRef, &sameTime); err != nil {
		t.Fatal(err)
	}
	if string(oldRef) != "r\uFFFD" || !sameTime {
		t.Fatalf("old row: ref_bytes %q, last_parked_at = parked_at %v", oldRef, sameTime)
	}

	seen, res := e.redriveAll()
	if res.Applied != 3 || len(seen) != 3 {
		t.Fatalf("redrive: %+v", res)
	}
	if r := seen[0]; r.ref != "r\uFFFD" || string(r.value) != "old" || len(r.headers) != 1 || string(r.headers[0].Value) != "v" {
		t.Errorf("old key-less row redriven as %+v", r)
	}
	if r := seen[1]; r.ref != "orders/0@1" || string(r.key) != "k" || r.valueNil || len(r.value) != 0 {
		t.Errorf("old row with a marker redriven as %+v", r)
	}
	if r := seen[2]; r.ref != "r\uFFFD" || string(r.value) != "new" {
		t.Errorf("new row redriven as %+v", r)
	}
}
