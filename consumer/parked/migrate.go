package parked

import (
	"embed"
	"io/fs"

	"github.com/effectively-once/effectively/pg"
)

// DefaultTable is the parked table's name when none is given.
const DefaultTable = "parked"

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Line returns the migration line of the parked-messages table
// schema.table, for pg.Migrate or pg.MigrationSQL.
//
// A row holds one message whole, as delivered: ref_bytes, msg_key, payload
// and headers are exact (a nil key or payload is NULL, an empty one an
// empty bytea; header values that are not text are kept in base64, a nil
// header value as "null": true), and ref, source and lane are readable
// text: the value itself when it is valid UTF-8 without NUL bytes, else
// quoted Go-style (such as "r\xff"), with the exact bytes in ref_bytes,
// source_bytes and lane_bytes. No parked delivery is dropped: the same
// message (same scope, source, ref, key, payload and headers) parked again
// keeps its row, whose park_count and last_parked_at count the parkings
// and whose reason and last_error are the newest; any other message, even
// under the same ref, gets a row of its own.
func Line(schema, table string) pg.Line {
	if schema == "" {
		schema = pg.DefaultSchema
	}
	if table == "" {
		table = DefaultTable
	}
	sub, _ := fs.Sub(migrationFiles, "migrations")
	return pg.Line{
		// The name is recorded with every migration applied: it must not
		// change.
		Name: "consumer:" + table,
		FS:   sub,
		Idents: map[string]string{
			"schema":           schema,
			"table":            table,
			"ref_idx":          table + "_ref_idx",
			"parked_at_idx":    table + "_parked_at_idx",
			"message_hash_idx": table + "_message_hash_idx",
			"ref_bytes_idx":    table + "_ref_bytes_idx",
		},
	}
}
