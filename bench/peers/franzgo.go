package peers

import (
	"context"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// runFranzGo is the consumer a careful team writes by hand with franz-go
// and pgx, batched: poll up to 500 records, apply them in one transaction
// that first inserts the batch's ids into processed_ids and writes the
// effects of only the ids it inserted (one unnest statement each), commit,
// then commit the batch's offsets synchronously. Rebalances wait while a
// batch is in hand (kgo.BlockRebalanceOnPoll), the group reads committed
// records only, and offsets are never committed automatically.
func runFranzGo(ctx context.Context, spec Spec, p *progress) error {
	pool, err := openPool(ctx, spec.DB)
	if err != nil {
		return err
	}
	defer pool.Close()
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(spec.Brokers...), kgo.ConsumerGroup(spec.Group), kgo.ConsumeTopics(spec.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll(), kgo.FetchMaxWait(maxWait),
		kgo.SessionTimeout(spec.SessionTimeout), kgo.HeartbeatInterval(heartbeat(spec)),
	)
	if err != nil {
		return err
	}
	defer cl.Close()
	// A poll blocks rebalances until AllowRebalance, and leaving the
	// group on Close is one.
	defer cl.AllowRebalance()
	for {
		fs := cl.PollRecords(ctx, 500)
		if ctx.Err() != nil {
			return nil
		}
		fs.EachError(func(topic string, partition int32, err error) {
			log.Printf("fetch %s/%d: %v", topic, partition, err)
		})
		recs := fs.Records()
		if len(recs) == 0 {
			cl.AllowRebalance()
			continue
		}
		p.inHand()
		ids := make([]string, len(recs))
		byID := make(map[string]transfer, len(recs))
		for i, r := range recs {
			t, err := parse(r.Value)
			if err != nil {
				return err
			}
			ids[i], byID[t.ID] = t.ID, t
		}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, `INSERT INTO processed_ids (msg_id) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING RETURNING msg_id`, ids)
			if err != nil {
				return err
			}
			fresh, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil || len(fresh) == 0 {
				return err
			}
			accounts := make([]string, len(fresh))
			amounts := make([]int64, len(fresh))
			for i, id := range fresh {
				accounts[i], amounts[i] = byID[id].Account, byID[id].Amount
			}
			_, err = tx.Exec(ctx, `INSERT INTO ledger (msg_id, account, amount)
SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])`, fresh, accounts, amounts)
			return err
		})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		p.commit(len(recs))
		if err := cl.CommitRecords(ctx, recs...); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			// The group moved on (a rebalance): the batch is delivered
			// again, here or to another member, and processed_ids drops it.
			log.Printf("commit the offsets of %d records: %v", len(recs), err)
			cl.AllowRebalance()
			continue
		}
		for _, r := range recs {
			p.settled(r.Partition, r.Offset)
		}
		cl.AllowRebalance()
	}
}
