package pgerr_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/effectively-once/effectively/internal/pgerr"
)

func TestClassify(t *testing.T) {
	own := pgerr.Table{Schema: "effectively", Name: "idempotency_responses"}
	pg := func(code, schema, table string) error {
		return fmt.Errorf("wrapped: %w", &pgconn.PgError{Severity: "ERROR", Code: code, SchemaName: schema, TableName: table})
	}
	for _, c := range []struct {
		name string
		err  error
		want pgerr.Kind
	}{
		{"no reply", errors.New("conn closed"), pgerr.Lost},
		{"terminated", &pgconn.PgError{Severity: "FATAL", Code: "57P01"}, pgerr.Lost},
		{"idle in transaction for too long: rolled back", &pgconn.PgError{Severity: "FATAL", Code: "25P03"}, pgerr.Passing},
		{"serialization", pg("40001", "", ""), pgerr.Passing},
		{"read only", pg("25006", "", ""), pgerr.Passing},
		{"unique on own table: a race", pg("23505", "effectively", "idempotency_responses"), pgerr.Passing},
		{"unique, same name, other schema", pg("23505", "public", "idempotency_responses"), pgerr.Refused},
		{"unique on the handler's table", pg("23505", "public", "payments"), pgerr.Refused},
		{"exclusion", pg("23P01", "public", "bookings"), pgerr.Refused},
		{"foreign key", pg("23503", "public", "payments"), pgerr.Refused},
		{"check", pg("23514", "public", "payments"), pgerr.Refused},
		{"raised by a trigger, no table", pg("23505", "", ""), pgerr.Refused},
		{"RAISE EXCEPTION", pg("P0001", "", ""), pgerr.Refused},
		{"data exception", pg("22003", "", ""), pgerr.Refused},
		{"undefined table", pg("42P01", "", ""), pgerr.Failed},
		{"permission", pg("42501", "", ""), pgerr.Failed},
	} {
		if got := pgerr.Classify(c.err, own); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
