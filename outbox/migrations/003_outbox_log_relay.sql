-- The log relay's slots: ready once everything the slot cannot deliver
-- (what was committed before it was created) has been published from the
-- table. A slot found without its row, or not ready, is recovered from the
-- table again before it is read.
CREATE TABLE {{schema}}.{{slots}} (
    slot       text        PRIMARY KEY,
    ready      boolean     NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- The rows the log relay must come back to: refused for good (parked), or
-- parked and then redriven (last_error kept, parked_at cleared), and not
-- yet published. Normally none.
CREATE INDEX ON {{schema}}.{{messages}} (sink, key, seq, id)
    WHERE published_at IS NULL AND last_error IS NOT NULL;
