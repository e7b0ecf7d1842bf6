package bloom

import (
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The gate is the first statement of a claim, sent in one batch with
// claimSQL. PostgreSQL runs the two one after the other, and in READ
// COMMITTED each takes its snapshot when it starts, so claimSQL sees every
// marker committed by a transaction the gate waited for.
//
// gateSharedSQL takes it shared: a barrier waits for the claim.
// gateTrySQL takes it exclusively if no other transaction holds it, which
// makes the claim a barrier (claimSQL then publishes its clock), and shared
// otherwise; upgradeSQL tries the same, already holding it shared. Neither
// waits for the exclusive lock, so no two claims can deadlock on the gate.
// Holding it exclusively is recorded in a transaction-local setting
// ($2, named after the gate) that claimSQL reads.
const (
	gateSharedSQL = `SELECT pg_advisory_xact_lock_shared($1)`
	gateTrySQL    = `SELECT CASE WHEN pg_try_advisory_xact_lock($1) THEN set_config($2, 'on', true)
            ELSE (SELECT '' FROM (SELECT pg_advisory_xact_lock_shared($1)) AS s) END`
	upgradeSQL = `SELECT pg_try_advisory_xact_lock($1) AND set_config($2, 'on', true) = 'on'`
)

// Row kinds returned by claimSQL.
const (
	rowFound  = 0 // a probed (key, slice) pair holds a marker
	rowHeld   = 2 // the target slice already held the key's marker
	rowClock  = 3 // the clocks, whether the claim ran, the count of keys inserted
	rowUnseen = 4 // the key's insert conflicted with a marker the snapshot does not see
)

// claimVersion is the markers' claim_version column as every insert sets
// it. The column is NOT NULL without a default (migration 002), so an
// insert by a process that predates the barrier, which does not set it,
// fails instead of writing a marker outside the barrier's protocol.
const claimVersion = "2"

// targetPartition stands, in claimSQL, for the target slice's partition,
// which the claim writes to directly rather than through the parent table.
const targetPartition = "{{target}}"

// claimSQLFor returns claimSQL for the slice starting at target; the last
// one is kept, since every claim of a slice uses the same.
func (s *Strategy) claimSQLFor(target time.Time) string {
	s.claimMu.Lock()
	defer s.claimMu.Unlock()
	if s.claimSlice != target.Unix() || s.claimText == "" {
		s.claimSlice = target.Unix()
		s.claimText = strings.ReplaceAll(s.claimSQL, targetPartition,
			pgx.Identifier{s.cfg.Schema, s.partitionName(target)}.Sanitize())
	}
	return s.claimText
}

func (s *Strategy) buildSQL() {
	lit := "'" + strings.ReplaceAll(s.barrierSeq, "'", "''") + "'"
	// barrierSQL publishes a barrier's clock ($1, in µs), keeping the
	// latest: run while holding the gate exclusively.
	s.barrierSQL = `SELECT setval(` + lit + `, greatest(last_value, $1::bigint)) FROM ` + s.barrierSeq

	// claimSQL reads the database clock and the latest barrier's clock
	// once, after the gate (it is a later statement). When the claim holds
	// the gate exclusively, it is a barrier itself, at the clock it reads,
	// and publishes it. The claim does its work only when the transaction
	// is READ COMMITTED, the latest barrier lies in the target slice
	// ($10 <= b < $11, in µs) and the clock in [$8, $9), the span in
	// which the live window the caller computed its probes for holds.
	// Otherwise it only reports the two clocks, and the caller plans again
	// from them.
	//
	// It then probes the (key, slice) pairs the filters could not rule out
	// ($1..$3), inserts the keys it did not find into the target slice
	// ($4..$6, sorted, in that order) with ON CONFLICT DO NOTHING, and
	// reads the marker of every key that conflicted there with a marker
	// committed before the statement started: its snapshot sees neither
	// its own inserts nor markers committed by a concurrent claim it
	// waited for, which it reports as unseen for the caller to read with
	// readHeldSQL. Inserted
	// keys are only counted: they are the keys it reports nothing about,
	// so the common claim, all keys new, returns a single row.
	s.claimSQL = `WITH c AS MATERIALIZED (
    SELECT clock_timestamp() AS now,
           current_setting('transaction_isolation') = 'read committed' AS rc,
           (SELECT last_value FROM ` + s.barrierSeq + `) AS b,
           coalesce(current_setting('` + s.exclusiveGUC + `', true), '') = 'on' AS excl
), x AS MATERIALIZED (
    SELECT c.now, c.rc,
           CASE WHEN c.excl
                THEN setval(` + lit + `, greatest(c.b, (extract(epoch FROM c.now) * 1000000)::bigint))
                ELSE c.b END AS b
    FROM c
), ok AS MATERIALIZED (
    SELECT x.now, x.rc, x.b,
           x.rc AND x.now >= $8::timestamptz AND x.now < $9::timestamptz
                AND x.b >= $10::bigint AND x.b < $11::bigint AS run
    FROM x
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
    INSERT INTO ` + targetPartition + ` (scope, id, slice, fingerprint, claim_version)
    SELECT k.scope, k.id, $7::timestamptz, k.fingerprint, ` + claimVersion + `
    FROM ok, unnest($4::text[], $5::text[], $6::bytea[]) WITH ORDINALITY AS k(scope, id, fingerprint, ord)
    WHERE ok.run AND (k.scope, k.id) NOT IN (SELECT scope, id FROM probe)
    ORDER BY k.ord
    ON CONFLICT DO NOTHING
    RETURNING scope, id
), counted AS MATERIALIZED (
    SELECT count(*) AS n FROM ins
), rest AS MATERIALIZED (
    SELECT scope, id FROM unnest($4::text[], $5::text[]) AS k(scope, id)
    EXCEPT SELECT scope, id FROM probe
    EXCEPT SELECT scope, id FROM ins
), held AS (
    SELECT r.scope, r.id, m.found, m.fingerprint
    FROM ok, rest AS r
    LEFT JOIN LATERAL (
        SELECT true AS found, m.fingerprint FROM ` + targetPartition + ` AS m
        WHERE m.scope = r.scope AND m.id = r.id AND m.slice = $7::timestamptz
        LIMIT 1
    ) AS m ON true
    WHERE ok.run
      -- evaluated once: when every key was found or inserted (the common
      -- case), rest is never computed
      AND (SELECT n FROM counted) + (SELECT count(*) FROM (SELECT DISTINCT scope, id FROM probe) AS d)
          < cardinality($4::text[])
)
SELECT ` + fmt.Sprint(rowFound) + `, scope, id, slice, fingerprint, NULL::timestamptz, NULL::bool, NULL::bool, NULL::bigint, NULL::bigint FROM probe
UNION ALL
SELECT CASE WHEN found THEN ` + fmt.Sprint(rowHeld) + ` ELSE ` + fmt.Sprint(rowUnseen) + ` END, scope, id, NULL, fingerprint, NULL, NULL, NULL, NULL, NULL FROM held
UNION ALL
SELECT ` + fmt.Sprint(rowClock) + `, NULL, NULL, NULL, NULL, now, rc, run, b, (SELECT n FROM counted) FROM ok`

	// readHeldSQL reads, in a new snapshot, the markers in the target slice
	// ($3) of keys whose insert conflicted with a marker that claimSQL's
	// snapshot did not see: written earlier in this transaction, or
	// committed by a concurrent claim while the insert waited for it.
	s.readHeldSQL = `SELECT m.scope, m.id, m.fingerprint
FROM unnest($1::text[], $2::text[]) AS k(scope, id)
JOIN ` + s.parent + ` AS m ON m.scope = k.scope AND m.id = k.id AND m.slice = $3::timestamptz`
}

// claimRow is one row of claimSQL.
type claimRow struct {
	kind      int
	scope, id *string
	slice     *time.Time
	fp        []byte
	now       *time.Time
	rc, run   *bool
	barrier   *int64
	inserted  *int64
}

func scanClaimRow(rows pgx.Rows) (claimRow, error) {
	var r claimRow
	err := rows.Scan(&r.kind, &r.scope, &r.id, &r.slice, &r.fp, &r.now, &r.rc, &r.run, &r.barrier, &r.inserted)
	return r, err
}
