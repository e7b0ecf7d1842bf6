-- Audit trail of marks moved past a hole by hand (Strategy.Advance).
CREATE TABLE IF NOT EXISTS {{schema}}.{{advances}} (
    id       bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    scope    text        NOT NULL,
    sender   text        NOT NULL,
    from_seq bigint      NOT NULL,
    to_seq   bigint      NOT NULL CHECK (to_seq > from_seq),
    reason   text        NOT NULL CHECK (reason <> ''),
    at       timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS {{advances_sender_idx}} ON {{schema}}.{{advances}} (scope, sender, at);
