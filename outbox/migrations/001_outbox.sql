-- The outbox: messages emitted inside business transactions, waiting for a
-- relay. seq is the message's place among its (sink, key) in commit order
-- (0 for a message without a key, which has no order to keep).
CREATE TABLE {{schema}}.{{messages}} (
    id              bigserial   PRIMARY KEY,
    part            integer     NOT NULL,
    sink            text        NOT NULL,
    key             bytea,
    seq             bigint      NOT NULL,
    msg_id          text        NOT NULL,
    value           bytea,
    headers         bytea,
    created_at      timestamptz NOT NULL DEFAULT now(),
    published_at    timestamptz,
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz,
    last_error      text,
    parked_at       timestamptz,
    park_reason     text
);

-- What a relay reads: the unpublished rows of its partitions, per key in seq order.
CREATE INDEX ON {{schema}}.{{messages}} (part, sink, key, seq) WHERE published_at IS NULL;

-- What the cleanup deletes.
CREATE INDEX ON {{schema}}.{{messages}} (published_at) WHERE published_at IS NOT NULL;

-- The per-(sink, key) counters: emitters of one key serialize on its row
-- until they commit, so seq order is commit order.
CREATE TABLE {{schema}}.{{counters}} (
    sink text   NOT NULL,
    key  bytea  NOT NULL,
    seq  bigint NOT NULL,
    PRIMARY KEY (sink, key)
);

-- One row per virtual partition once a relay has held it: who holds it,
-- until when, and a generation that grows with every change of holder.
CREATE TABLE {{schema}}.{{leases}} (
    part       integer     PRIMARY KEY,
    owner      text        NOT NULL,
    generation bigint      NOT NULL,
    expires_at timestamptz NOT NULL
);

-- Relays alive, so that each takes its share of the partitions.
CREATE TABLE {{schema}}.{{relays}} (
    owner      text        PRIMARY KEY,
    expires_at timestamptz NOT NULL
);

-- Every partition has its lease row from the start, free (expired) until a
-- relay takes it. 64 is Partitions in outbox.go.
INSERT INTO {{schema}}.{{leases}} (part, owner, generation, expires_at)
SELECT p, '', 0, '-infinity' FROM generate_series(0, 63) AS p;
