package bloom

import (
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The statements of a claim, sent together as one pipelined batch: the
// gate, the key locks, and claimSQL. PostgreSQL runs them one after the
// other, and in READ COMMITTED each takes its snapshot when it starts, so
// claimSQL sees every marker committed by a transaction the locks waited
// for.
const (
	gateSQL  = `SELECT pg_advisory_xact_lock_shared($1)`
	locksSQL = `SELECT count(pg_advisory_xact_lock(h)) FROM unnest($1::bigint[]) AS h`
)

// Row kinds returned by claimSQL.
const (
	rowFound    = 0 // a probed (key, slice) pair holds a marker
	rowInserted = 1 // the key's marker was written to the target slice
	rowHeld     = 2 // the target slice already held the key's marker
	rowClock    = 3 // the database clock, and whether the claim ran
)

func (s *Strategy) buildSQL() {
	// claimSQL reads the database clock once (after the locks: it is a
	// later statement), and does its work only when the transaction is
	// READ COMMITTED and the clock lies in [$8, $9): the span in which the
	// target slice ($7) and the live window the caller computed its
	// probes for hold. Otherwise it only reports the clock, and the caller
	// plans again from it.
	//
	// It then probes the (key, slice) pairs the filters could not rule out
	// ($1..$3), inserts the keys it did not find into the target slice
	// ($4..$6) with ON CONFLICT DO NOTHING, and reads the marker of every
	// key that conflicted there: the statement's snapshot does not see its
	// own inserts, so that read finds only markers committed before it.
	s.claimSQL = `WITH c AS MATERIALIZED (
    SELECT clock_timestamp() AS now,
           current_setting('transaction_isolation') = 'read committed' AS rc
), ok AS MATERIALIZED (
    SELECT c.now, c.rc, c.rc AND c.now >= $8::timestamptz AND c.now < $9::timestamptz AS run FROM c
), probe AS MATERIALIZED (
    SELECT p.scope, p.id, p.slice, m.fingerprint
    FROM ok, unnest($1::text[], $2::text[], $3::timestamptz[]) AS p(scope, id, slice)
    CROSS JOIN LATERAL (
        SELECT m.fingerprint FROM ` + s.parent + ` AS m
        WHERE m.scope = p.scope AND m.id = p.id AND m.slice = p.slice
        LIMIT 1
    ) AS m
    WHERE ok.run
), ins AS (
    INSERT INTO ` + s.parent + ` (scope, id, slice, fingerprint)
    SELECT k.scope, k.id, $7::timestamptz, k.fingerprint
    FROM ok, unnest($4::text[], $5::text[], $6::bytea[]) AS k(scope, id, fingerprint)
    WHERE ok.run AND (k.scope, k.id) NOT IN (SELECT scope, id FROM probe)
    ON CONFLICT DO NOTHING
    RETURNING scope, id
), rest AS MATERIALIZED (
    SELECT scope, id FROM unnest($4::text[], $5::text[]) AS k(scope, id)
    EXCEPT SELECT scope, id FROM probe
    EXCEPT SELECT scope, id FROM ins
), held AS (
    SELECT r.scope, r.id, m.fingerprint
    FROM ok, rest AS r
    CROSS JOIN LATERAL (
        SELECT m.fingerprint FROM ` + s.parent + ` AS m
        WHERE m.scope = r.scope AND m.id = r.id AND m.slice = $7::timestamptz
        LIMIT 1
    ) AS m
    WHERE ok.run
      -- evaluated once: when every key was found or inserted (the common
      -- case), rest is never computed
      AND (SELECT count(*) FROM ins) + (SELECT count(*) FROM (SELECT DISTINCT scope, id FROM probe) AS d)
          < cardinality($4::text[])
)
SELECT ` + fmt.Sprint(rowFound) + `, scope, id, slice, fingerprint, NULL::timestamptz, NULL::bool, NULL::bool FROM probe
UNION ALL
SELECT ` + fmt.Sprint(rowInserted) + `, scope, id, NULL, NULL, NULL, NULL, NULL FROM ins
UNION ALL
SELECT ` + fmt.Sprint(rowHeld) + `, scope, id, NULL, fingerprint, NULL, NULL, NULL FROM held
UNION ALL
SELECT ` + fmt.Sprint(rowClock) + `, NULL, NULL, NULL, NULL, now, rc, run FROM ok`
}

// claimRow is one row of claimSQL.
type claimRow struct {
	kind      int
	scope, id *string
	slice     *time.Time
	fp        []byte
	now       *time.Time
	rc, run   *bool
}

func scanClaimRow(rows pgx.Rows) (claimRow, error) {
	var r claimRow
	err := rows.Scan(&r.kind, &r.scope, &r.id, &r.slice, &r.fp, &r.now, &r.rc, &r.run)
	return r, err
}
