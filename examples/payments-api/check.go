package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/effectively-once/effectively/consumer/parked"
)

// check compares the database with the logical payments: money moved once
// per accepted payment, each declined payment recorded once, every
// accepted payment settled once, the poison event parked. It prints a
// report and returns an error listing what does not hold.
func (r *paymentsRun) check(ctx context.Context, hooks *outcomes) error {
	var problems []string
	fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	want := map[[2]string]int64{}
	for _, t := range tenants {
		for a := range accountsPer {
			want[[2]string{t, fmt.Sprintf("a%d", a)}] = startBalance
		}
	}
	accepted, declined := 0, 0
	for _, p := range r.payments {
		switch p.status {
		case http.StatusCreated:
			accepted++
			want[[2]string{p.tenant, p.body.From}] -= p.body.Amount
			want[[2]string{p.tenant, p.body.To}] += p.body.Amount
		case http.StatusPaymentRequired:
			declined++
		default:
			fail("%s/%s has no answer", p.tenant, p.key)
		}
	}
	rows, err := r.pool.Query(ctx, `SELECT tenant, id, balance FROM pay_accounts`)
	if err != nil {
		return err
	}
	var total int64
	for rows.Next() {
		var t, id string
		var b int64
		if err := rows.Scan(&t, &id, &b); err != nil {
			return err
		}
		total += b
		if w := want[[2]string{t, id}]; b != w {
			fail("account %s/%s holds %d, want %d", t, id, b, w)
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if w := int64(len(tenants) * accountsPer * startBalance); total != w {
		fail("the accounts hold %d in all, want %d: money was made or lost", total, w)
	}

	var payments, declinedRows, settled, settlements, settledOnce int
	err = r.pool.QueryRow(ctx, `SELECT
  (SELECT count(*) FROM pay_payments WHERE status <> 'declined'),
  (SELECT count(*) FROM pay_payments WHERE status = 'declined'),
  (SELECT count(*) FROM pay_payments WHERE status = 'settled'),
  (SELECT count(*) FROM pay_settlements),
  (SELECT count(DISTINCT payment_id) FROM pay_settlements)`).Scan(&payments, &declinedRows, &settled, &settlements, &settledOnce)
	if err != nil {
		return err
	}
	if payments != accepted || declinedRows != declined {
		fail("%d payments and %d declined recorded, want %d and %d", payments, declinedRows, accepted, declined)
	}
	if settled != accepted || settlements != accepted || settledOnce != accepted {
		fail("%d payments settled by %d settlements (%d distinct), want %d of each", settled, settlements, settledOnce, accepted)
	}
	// The settlement consumer's parked messages, through the parked table's
	// store: the rows of its scope (its Name, "provider-events").
	parked, err := parked.NewStore(r.pool, "", "").Count(ctx, parked.Filter{Scope: "provider-events"})
	if err != nil {
		return err
	}
	hooks.mu.Lock()
	st := hooks.BatchStats
	hooks.mu.Unlock()
	if st.Retried == 0 {
		fail("no settlement event failed and was delivered again; every 50th should have")
	}
	if parked != 1 {
		fail("%d settlement events parked, want the one poison event", parked)
	}

	fmt.Printf("payments: %d logical (%d accepted, %d declined), %d requests sent, %d responses lost and retried, %d replayed, %d answered 409/503\n",
		len(r.payments), accepted, declined, r.sent.Load(), r.lost.Load(), r.replayed.Load(), r.conflicts.Load())
	fmt.Printf("webhooks: %d applied, %d duplicates, %d parked, %d retried\n", st.Applied, st.Duplicate, st.Parked, st.Retried)
	if len(problems) > 0 {
		return fmt.Errorf("%d checks failed:\n  %s", len(problems), strings.Join(problems, "\n  "))
	}
	fmt.Println("ok: money moved once per payment, every retry got the first response, every payment settled once")
	return nil
}
