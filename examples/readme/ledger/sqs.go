package ledger

import (
	"context"

	"github.com/effectively-once/effectively/sources/sqs"
	"github.com/jackc/pgx/v5/pgxpool"
)

// RunSQS books the transfers of an SQS queue until ctx is done. Region and
// credentials come from the AWS default chain (AWS_REGION, …).
func RunSQS(ctx context.Context, pool *pgxpool.Pool, queueURL string) error {
	src, err := sqs.New(ctx, sqs.Config{QueueURL: queueURL})
	if err != nil {
		return err
	}
	defer src.Close()
	return Run(ctx, pool, src)
}
