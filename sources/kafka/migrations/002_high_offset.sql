-- The offset after the highest record whose batch committed. A batch can
-- commit records above next_offset while an earlier record waits for a
-- retry, leaving next_offset where it was; a source compares this column
-- too, so that losing such commits (an asynchronous failover) is seen.
-- NULL in rows written before this column existed.
ALTER TABLE {{schema}}.{{table}} ADD COLUMN IF NOT EXISTS high_offset bigint;
