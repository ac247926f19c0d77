-- Epochs of the log (crates/server/src/store/epoch.rs). A new epoch begins
-- whenever the store may have lost a suffix of the log (a promotion, a
-- point-in-time restore, a restored backup); its ids begin past every id an
-- earlier epoch can have handed out, and (fork, base] names what was lost.
-- Epoch 0 begins at 0: a log that never lost history keeps its ids.
CREATE TABLE IF NOT EXISTS tidings_epochs (
    epoch      integer PRIMARY KEY,
    -- The last id that survived into this epoch.
    fork       bigint  NOT NULL,
    -- Ids of this epoch are base + 1, base + 2, ...
    base       bigint  NOT NULL,
    reason     text    NOT NULL,
    started_ms bigint  NOT NULL,
    -- The PostgreSQL timeline and system identifier it began on.
    timeline   bigint,
    system_id  text
);
INSERT INTO tidings_epochs (epoch, fork, base, reason, started_ms)
VALUES (0, 0, 0, 'initial', (extract(epoch FROM now()) * 1000)::bigint) ON CONFLICT DO NOTHING;

-- The head row names the current epoch and the timeline and cluster that
-- its ids are handed out on: an append on another timeline matches no head
-- row, so nothing is appended before the store begins a new epoch. NULL
-- until a process first adopts the cluster it finds.
ALTER TABLE tidings_head ADD COLUMN IF NOT EXISTS epoch integer NOT NULL DEFAULT 0;
ALTER TABLE tidings_head ADD COLUMN IF NOT EXISTS timeline bigint;
ALTER TABLE tidings_head ADD COLUMN IF NOT EXISTS system_id text;

-- What every append checks under the head row's lock: that the database it
-- commits on is still on the timeline the epoch's ids are handed out on (a
-- promoted standby, or a point-in-time restore, is on a new one), and that
-- the head is not below an id the appending process saw committed (a
-- database that lost a suffix without a new timeline). Either way a lost
-- suffix's ids must not be handed out again: the append fails with TD001
-- and the server begins a new epoch first. pg_walfile_name names the
-- timeline WAL is written on now, read from memory.
CREATE OR REPLACE FUNCTION tidings_append_check(epoch_timeline bigint, head bigint, seen bigint) RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now_on bigint := ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint;
BEGIN
    IF epoch_timeline IS DISTINCT FROM now_on THEN
        RAISE EXCEPTION 'the log''s epoch was on timeline %, the database is on timeline %', epoch_timeline, now_on
            USING ERRCODE = 'TD001';
    END IF;
    IF head < seen THEN
        RAISE EXCEPTION 'the log''s head % is below id %, which this process saw committed', head, seen
            USING ERRCODE = 'TD001';
    END IF;
    RETURN true;
END
$$;
