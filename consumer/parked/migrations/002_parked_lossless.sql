-- Every parked delivery is kept, with its ref as it was.
--
-- ref_bytes is the ref's exact bytes; ref stays a readable rendering of it
-- (the ref itself when it is valid UTF-8 without NUL bytes, else quoted
-- Go-style, such as "r\xff"). source_bytes and lane_bytes hold the exact
-- source and lane when their text columns had to be rendered that way, and
-- are NULL otherwise.
--
-- message_hash identifies a message: a SHA-256 of scope, source, ref, key,
-- payload and headers, each kept apart from an absent (nil) one. The same
-- message parked again updates its row (park_count, last_parked_at, the
-- newest reason and error); any other message, even under the same ref,
-- gets a row of its own. Rows parked before this migration have no hash:
-- they are never merged with a new row.
--
-- The unique index on (scope, source, ref) goes: it made a second message
-- under a ref already parked vanish. Consumers of earlier versions insert
-- with that index as their ON CONFLICT target, so their parking fails (the
-- batch rolls back and is delivered again, nothing is lost) until they are
-- upgraded too.
ALTER TABLE {{schema}}.{{table}}
    ADD COLUMN IF NOT EXISTS ref_bytes      bytea,
    ADD COLUMN IF NOT EXISTS source_bytes   bytea,
    ADD COLUMN IF NOT EXISTS lane_bytes     bytea,
    ADD COLUMN IF NOT EXISTS message_hash   bytea,
    ADD COLUMN IF NOT EXISTS park_count     integer NOT NULL DEFAULT 1,
    ADD COLUMN IF NOT EXISTS last_parked_at timestamptz;

UPDATE {{schema}}.{{table}}
SET ref_bytes = convert_to(ref, 'UTF8'), last_parked_at = parked_at
WHERE ref_bytes IS NULL OR last_parked_at IS NULL;

ALTER TABLE {{schema}}.{{table}}
    ALTER COLUMN ref_bytes SET NOT NULL,
    ALTER COLUMN last_parked_at SET NOT NULL,
    ALTER COLUMN last_parked_at SET DEFAULT now();

DROP INDEX IF EXISTS {{schema}}.{{ref_idx}};
CREATE UNIQUE INDEX IF NOT EXISTS {{message_hash_idx}} ON {{schema}}.{{table}} (message_hash);
-- A hash index: refs of any length, looked up by equality.
CREATE INDEX IF NOT EXISTS {{ref_bytes_idx}} ON {{schema}}.{{table}} USING hash (ref_bytes);
