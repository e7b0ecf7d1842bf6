package idempotency_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/effectively-once/effectively/idempotency"
)

// constraintTables has one table per kind of refusal a handler's write can
// meet, each in an immediate and a deferred (checked at COMMIT) form. The
// value "bad" (or the range [1,10), or the reference 999) is refused; any
// other value passes.
const constraintTables = `
CREATE TABLE uq_i (v text UNIQUE);
CREATE TABLE uq_d (v text, CONSTRAINT uq_d_v UNIQUE (v) DEFERRABLE INITIALLY DEFERRED);
INSERT INTO uq_i VALUES ('bad'); INSERT INTO uq_d VALUES ('bad');
CREATE TABLE ex_i (r int4range, EXCLUDE USING gist (r WITH &&));
CREATE TABLE ex_d (r int4range, EXCLUDE USING gist (r WITH &&) DEFERRABLE INITIALLY DEFERRED);
INSERT INTO ex_i VALUES ('[1,10)'); INSERT INTO ex_d VALUES ('[1,10)');
CREATE TABLE parents (id int PRIMARY KEY); INSERT INTO parents VALUES (1);
CREATE TABLE fk_i (ref int REFERENCES parents (id));
CREATE TABLE fk_d (ref int REFERENCES parents (id) DEFERRABLE INITIALLY DEFERRED);
CREATE TABLE ck_i (v text CHECK (v <> 'bad'));
CREATE TABLE ck_d (v text);
CREATE TABLE tr_i (v text);
CREATE TABLE tr_d (v text);
CREATE FUNCTION refuse_check() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.v = 'bad' THEN RAISE EXCEPTION 'v must not be bad' USING ERRCODE = 'check_violation'; END IF;
  RETURN NULL;
END $$;
CREATE FUNCTION refuse_raise() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.v = 'bad' THEN RAISE EXCEPTION 'business rule: v must not be bad'; END IF;
  RETURN NEW;
END $$;
CREATE CONSTRAINT TRIGGER ck_d_check AFTER INSERT ON ck_d DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW EXECUTE FUNCTION refuse_check();
CREATE TRIGGER tr_i_raise BEFORE INSERT ON tr_i FOR EACH ROW EXECUTE FUNCTION refuse_raise();
CREATE CONSTRAINT TRIGGER tr_d_raise AFTER INSERT ON tr_d DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW EXECUTE FUNCTION refuse_raise();
`

// constraintWrite is a request to constraintHandler: insert V into Table.
type constraintWrite struct {
	Table string `json:"table"`
	V     string `json:"v"`
}

// constraintInsert returns the INSERT of w, its value refused when bad.
func constraintInsert(w constraintWrite, bad bool) (string, any) {
	switch w.Table {
	case "ex_i", "ex_d":
		if bad {
			return `INSERT INTO ` + w.Table + ` VALUES ($1::int4range)`, "[5,6)"
		}
		return `INSERT INTO ` + w.Table + ` VALUES ($1::int4range)`, "[20,21)"
	case "fk_i", "fk_d":
		if bad {
			return `INSERT INTO ` + w.Table + ` VALUES ($1::int)`, "999"
		}
		return `INSERT INTO ` + w.Table + ` VALUES ($1::int)`, "1"
	}
	if bad {
		return `INSERT INTO ` + w.Table + ` VALUES ($1)`, "bad"
	}
	return `INSERT INTO ` + w.Table + ` VALUES ($1)`, w.V
}

// carelessHandler writes through the request's transaction and answers
// 201 whatever the write returned, as a handler that drops an error does:
// the middleware must not store or send a success whose writes failed.
func carelessHandler(w http.ResponseWriter, r *http.Request) {
	var cw constraintWrite
	if err := json.NewDecoder(r.Body).Decode(&cw); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	sql, arg := constraintInsert(cw, cw.V == "bad")
	_, _ = idempotency.Tx(r.Context()).Exec(r.Context(), sql, arg)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"table":%q,"v":%q}`, cw.Table, cw.V)
}

// TestHandlerWriteRefused: a handler's write refused by a constraint (at
// once, or at COMMIT for a deferred one), whichever kind, is a permanent
// failure of this request: 422, no Retry-After, nothing stored, so the
// client fixes the request and sends it again with the same key, which
// then runs.
func TestHandlerWriteRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, idempotency.Config{SingleTenant: true}, http.HandlerFunc(carelessHandler))
	if _, err := e.pool.Exec(context.Background(), constraintTables); err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"uq_i", "uq_d", "ex_i", "ex_d", "fk_i", "fk_d", "ck_i", "ck_d", "tr_i", "tr_d"} {
		t.Run(table, func(t *testing.T) {
			key := "refused-" + table
			r := e.post(t, key, fmt.Sprintf(`{"table":%q,"v":"bad"}`, table))
			wantStatus(t, r, http.StatusUnprocessableEntity)
			if ra := r.header.Get("Retry-After"); ra != "" {
				t.Fatalf("Retry-After %q on a request that cannot succeed", ra)
			}
			if r.header.Get("Content-Type") != "application/problem+json" {
				t.Fatalf("Content-Type %q", r.header.Get("Content-Type"))
			}
			var n int
			if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM effectively.idempotency_responses WHERE key = $1`, key).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 0 {
				t.Fatalf("%d responses stored for a refused request", n)
			}
			// The same key with a fixed request runs (nothing was kept).
			ok := e.post(t, key, fmt.Sprintf(`{"table":%q,"v":"good-%s"}`, table, table))
			wantStatus(t, ok, http.StatusCreated)
			if ok.header.Get(idempotency.ReplayedHeader) != "" {
				t.Fatal("the fixed request was answered from the store")
			}
		})
	}
}
