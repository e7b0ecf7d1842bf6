-- The database clock (microseconds since 1970) at the latest barrier: the
-- moment a seal, a warm-up or a claim held the gate exclusively, when no
-- claim was in flight. Claims write their markers to the slice of this
-- clock, which spares them per-key locks. A sequence, so that it is updated
-- outside the barrier's transaction: the barrier happened whether or not
-- that transaction commits.
CREATE SEQUENCE {{schema}}.{{barrier}} MINVALUE 0 START 0;
