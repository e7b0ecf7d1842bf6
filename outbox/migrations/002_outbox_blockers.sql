-- The rows that hold their key back: unpublished and parked or waiting for
-- a retry. A relay asks, for each row it may publish, whether an earlier row
-- of its key is one of these; through this index that costs the blockers
-- (normally none), not every earlier unpublished row of the key.
CREATE INDEX ON {{schema}}.{{messages}} (part, sink, key, seq)
    WHERE published_at IS NULL AND (parked_at IS NOT NULL OR next_attempt_at IS NOT NULL);
