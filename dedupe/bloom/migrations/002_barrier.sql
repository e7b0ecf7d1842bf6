-- The database clock (microseconds since 1970) at the latest barrier: the
-- moment a seal, a warm-up or a claim held the gate exclusively, when no
-- claim was in flight. Claims write their markers to the slice of this
-- clock, which spares them per-key locks. A sequence, so that it is updated
-- outside the barrier's transaction: the barrier happened whether or not
-- that transaction commits.
CREATE SEQUENCE {{schema}}.{{barrier}} MINVALUE 0 START 0;

-- The claim version: set by every claim of this protocol, unknown to a
-- claim that takes per-key locks instead, whose insert then fails with a
-- not-null violation rather than write a marker the barrier does not
-- serialise. Adding it with a constant default and dropping the default
-- rewrites no partition; partitions created later inherit it.
ALTER TABLE {{schema}}.{{table}} ADD COLUMN claim_version smallint NOT NULL DEFAULT 2;
ALTER TABLE {{schema}}.{{table}} ALTER COLUMN claim_version DROP DEFAULT;
