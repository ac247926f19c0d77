-- Publishing from the application's own transaction. An application calls
-- tidings.publish(...) inside its transaction; the call checks the event's
-- name (and, in strict mode, that the registry knows it) and writes one row
-- into tidings.outbox, with a wake-up (NOTIFY tidings_outbox, sent at
-- commit) when no other committed row is waiting. Nothing touches the log or its head row, so a long application
-- transaction holds up no publisher. A tidings process moves committed rows
-- into the log in the order they became visible, in one transaction with
-- their deletion: exactly once, ids gap-free and commit-ordered with every
-- other publish. A rolled-back call leaves nothing.
CREATE SCHEMA IF NOT EXISTS tidings;
REVOKE ALL ON SCHEMA tidings FROM PUBLIC;

CREATE TABLE IF NOT EXISTS tidings.outbox (
    seq             BIGSERIAL   PRIMARY KEY,
    -- The event as a publish request ({event_type, payload, ref, agent, ...}).
    event           JSONB       NOT NULL,
    idempotency_key TEXT,
    -- The calling role: the scope of its idempotency keys.
    publisher       TEXT        NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    -- Set aside (never moved): why, as a stable code and a message.
    error_code      TEXT,
    error           TEXT
);
CREATE INDEX IF NOT EXISTS tidings_outbox_pending ON tidings.outbox (seq) WHERE error_code IS NULL;

-- The mover's turn: one process at a time holds this row for its move. A
-- row lock on a table of tidings' own, not an advisory lock, which any
-- role that can connect could take and hold.
CREATE TABLE IF NOT EXISTS tidings.mover (singleton BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton));
INSERT INTO tidings.mover DEFAULT VALUES ON CONFLICT DO NOTHING;

-- The server's registry as SQL sees it: every registered name and alias,
-- and whether unregistered types are refused. Written by each tidings
-- process at start-up and on reload.
CREATE TABLE IF NOT EXISTS tidings.registry (name TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS tidings.registry_mode (
    singleton BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton),
    strict    BOOLEAN NOT NULL
);

CREATE OR REPLACE FUNCTION tidings.publish(
    event_type      TEXT,
    payload         JSONB       DEFAULT '{}',
    ref             TEXT        DEFAULT NULL,
    agent_id        TEXT        DEFAULT NULL,
    agent_kind      TEXT        DEFAULT NULL,
    session_id      TEXT        DEFAULT NULL,
    links           JSONB       DEFAULT '[]',
    visibility      TEXT        DEFAULT 'public',
    occurred_at     TIMESTAMPTZ DEFAULT NULL,
    idempotency_key TEXT        DEFAULT NULL
) RETURNS BIGINT
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    queued BIGINT;
BEGIN
    IF event_type IS NULL OR octet_length(event_type) > 255
       OR event_type !~ '^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'invalid_event_name',
            DETAIL = format('%L is not two or more lowercase snake_case segments joined by "."', event_type);
    END IF;
    IF EXISTS (SELECT 1 FROM tidings.registry_mode WHERE strict)
       AND NOT EXISTS (SELECT 1 FROM tidings.registry r WHERE r.name = event_type) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'unregistered_event_type',
            DETAIL = format('event type %L is not in the registry (strict mode)', event_type);
    END IF;
    IF payload IS NULL OR jsonb_typeof(payload) <> 'object' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'invalid_event', DETAIL = 'payload must be a JSON object';
    END IF;
    IF visibility IS NULL OR visibility NOT IN ('public', 'reviewer_only', 'admin') THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'invalid_event',
            DETAIL = 'visibility is public, reviewer_only or admin';
    END IF;
    IF idempotency_key IS NOT NULL AND idempotency_key !~ '^[!-~]{1,255}$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'invalid_idempotency_key',
            DETAIL = 'an idempotency key is 1 to 255 visible ASCII characters';
    END IF;
    INSERT INTO tidings.outbox (event, idempotency_key, publisher)
    VALUES (
        jsonb_build_object(
            'event_type', event_type,
            'payload', payload,
            'ref', ref,
            'agent', CASE WHEN agent_id IS NULL THEN NULL ELSE jsonb_build_object('id', agent_id, 'kind', agent_kind) END,
            'session_id', session_id,
            'links', coalesce(links, '[]'::jsonb),
            'visibility', visibility,
            'occurred_at', to_jsonb(occurred_at)
        ),
        idempotency_key,
        session_user
    )
    RETURNING seq INTO queued;
    -- Wake the mover only when it may be idle: a NOTIFY serialises the
    -- commits of every transaction that sent one (64 sessions publishing
    -- at once committed 3.2 times slower with one per call), and while
    -- committed rows wait the mover is polling anyway.
    IF NOT EXISTS (SELECT 1 FROM tidings.outbox o WHERE o.error_code IS NULL AND o.seq <> queued) THEN
        PERFORM pg_notify('tidings_outbox', '');
    END IF;
    RETURN queued;
END;
$$;

-- Only roles granted it may publish: GRANT USAGE ON SCHEMA tidings and
-- EXECUTE ON FUNCTION tidings.publish to the application's role; it needs
-- nothing on the log or the outbox.
REVOKE ALL ON FUNCTION tidings.publish(TEXT, JSONB, TEXT, TEXT, TEXT, TEXT, JSONB, TEXT, TIMESTAMPTZ, TEXT) FROM PUBLIC;
