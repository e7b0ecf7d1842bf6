package idset

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/effectively/dedupe"
)

// claimSQL inserts the batch's markers, in the given (sorted) order, and
// returns, in one row, the positions (1-based) of the keys it did not
// insert because their marker existed. On the happy path, where every key
// is new, that is one empty array: the claim costs a batched insert and no
// row per key to send back and read.
func claimSQL(table string) string {
	return `WITH u AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[]) WITH ORDINALITY AS u(scope, id, fingerprint, ord)
), ins AS (
    INSERT INTO ` + table + ` (scope, id, fingerprint)
    SELECT u.scope, u.id, u.fingerprint FROM u ORDER BY u.ord
    ON CONFLICT (scope, id) DO NOTHING
    RETURNING scope, id
)
SELECT coalesce(array_agg(u.ord ORDER BY u.ord) FILTER (WHERE ins.id IS NULL), '{}')
FROM u LEFT JOIN ins ON ins.scope = u.scope AND ins.id = u.id`
}

// fetchSQL reads the fingerprints of the markers a claim did not insert
// because they existed: committed before, written earlier in the same
// transaction, or committed by a concurrent transaction while the claim
// waited for it. As a new statement it has a new snapshot that sees all of
// them (in READ COMMITTED; under stricter isolation levels the claim
// statement itself fails on a concurrent conflict).
func fetchSQL(table string) string {
	return `SELECT u.ord, m.fingerprint
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS u(scope, id, ord)
JOIN ` + table + ` AS m ON m.scope = u.scope AND m.id = u.id`
}

// ref is a key's identity for idset.
type ref struct{ scope, id string }

// marker is what a claim learned about one distinct key of the batch.
type marker struct {
	inserted bool   // this claim wrote the marker
	existed  bool   // a marker was found (before the claim, or committed concurrently)
	fp       []byte // the found marker's fingerprint
}

// Claim decides the verdicts of keys in one statement (two in the rare case
// that another transaction committed some of the same keys while the claim
// waited for it), and writes the markers of new keys in tx.
//
// Every key needs a Scope and a non-empty ID that pass dedupe.Validate with
// the configured MaxIDLen; otherwise Claim returns a *dedupe.KeyError for
// the first bad key and claims nothing. A key repeated within keys is
// treated like a redelivery of its first occurrence: the first occurrence
// decides, and a repeat is a duplicate, or a mismatch when its fingerprint
// differs from the marker's (the first occurrence's when that one is new).
// A missing fingerprint never mismatches.
func (s *Strategy) Claim(ctx context.Context, tx pgx.Tx, keys []dedupe.Key) ([]dedupe.Verdict, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	for _, k := range keys {
		if err := s.check(k); err != nil {
			return nil, err
		}
	}

	// Distinct keys, sorted so that concurrent claims of overlapping
	// batches lock their markers in the same order and cannot deadlock.
	pos := make(map[ref]int, len(keys)) // key → index of its first occurrence, then its slot
	firsts := make([]int, 0, len(keys))
	for i, k := range keys {
		r := ref{k.Scope, k.ID}
		if _, seen := pos[r]; !seen {
			pos[r] = i
			firsts = append(firsts, i)
		}
	}
	slices.SortFunc(firsts, func(a, b int) int {
		return cmp.Or(cmp.Compare(keys[a].Scope, keys[b].Scope), cmp.Compare(keys[a].ID, keys[b].ID))
	})
	scopes := make([]string, len(firsts))
	ids := make([]string, len(firsts))
	fps := make([][]byte, len(firsts))
	for slot, i := range firsts {
		k := keys[i]
		pos[ref{k.Scope, k.ID}] = slot
		scopes[slot], ids[slot] = k.Scope, k.ID
		if len(k.Fingerprint) > 0 {
			fps[slot] = k.Fingerprint
		}
	}

	markers, err := s.claim(ctx, tx, scopes, ids, fps)
	if err != nil {
		return nil, err
	}

	verdicts := make([]dedupe.Verdict, len(keys))
	decided := make([]bool, len(firsts))
	for i, k := range keys {
		slot := pos[ref{k.Scope, k.ID}]
		m := markers[slot]
		stored := m.fp
		if !m.existed && m.inserted {
			if !decided[slot] {
				decided[slot] = true
				verdicts[i] = dedupe.VerdictNew
				continue
			}
			stored = fps[slot] // a repeat of a new key compares with the marker just written
		}
		decided[slot] = true
		if dedupe.SameFingerprint(stored, k.Fingerprint) {
			verdicts[i] = dedupe.VerdictDuplicate
		} else {
			verdicts[i] = dedupe.VerdictMismatch
		}
	}
	return verdicts, nil
}

// claim runs the claim statement for distinct keys and returns what it
// learned about each, by slot. Keys it did not insert cost a second
// statement, for the whole batch, to read their markers' fingerprints.
func (s *Strategy) claim(ctx context.Context, tx pgx.Tx, scopes, ids []string, fps [][]byte) ([]marker, error) {
	markers := make([]marker, len(scopes))
	var existing []int64 // positions (1-based) of the keys not inserted
	if err := tx.QueryRow(ctx, s.claimSQL, scopes, ids, fps).Scan(&existing); err != nil {
		return nil, fmt.Errorf("idset: claim: %w", err)
	}
	for slot := range markers {
		markers[slot].inserted = true
	}
	if len(existing) == 0 {
		return markers, nil
	}
	for _, ord := range existing {
		if ord < 1 || int(ord) > len(markers) {
			return nil, fmt.Errorf("idset: claim: the claim named key %d of %d", ord, len(markers))
		}
		markers[ord-1].inserted = false
	}

	var rs, ri []string
	var slots []int
	for slot, m := range markers {
		if !m.inserted {
			rs, ri = append(rs, scopes[slot]), append(ri, ids[slot])
			slots = append(slots, slot)
			// A marker that is gone again by now was swept: it still
			// existed, so the key is a duplicate either way.
			markers[slot].existed = true
		}
	}
	rows, err := tx.Query(ctx, s.fetchSQL, rs, ri)
	if err != nil {
		return nil, fmt.Errorf("idset: claim: reading existing markers: %w", err)
	}
	var ord int64
	var fp []byte
	_, err = pgx.ForEachRow(rows, []any{&ord, &fp}, func() error {
		markers[slots[ord-1]].fp = fp
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("idset: claim: reading existing markers: %w", err)
	}
	return markers, nil
}

// check reports a key idset cannot store.
func (s *Strategy) check(k dedupe.Key) error {
	if k.ID == "" {
		return &dedupe.KeyError{Key: k, Reason: "empty id"}
	}
	return dedupe.Validate(k, s.cfg.MaxIDLen)
}
