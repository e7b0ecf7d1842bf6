-- Header values are stored byte for byte: RFC 9110 allows obs-text (bytes
-- 0x80-0xFF) in a field value, which a text[] cannot hold. Rows written
-- before keep their values in headers, and are read from there.
ALTER TABLE {{schema}}.{{table}} ADD COLUMN raw_headers bytea[];
ALTER TABLE {{schema}}.{{table}} ALTER COLUMN headers SET DEFAULT '{}';
