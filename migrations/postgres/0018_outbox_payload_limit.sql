-- What tidings.publish checks that only the server's settings know: the
-- largest payload (TIDINGS_MAX_PAYLOAD), written by each process at start-up
-- with the registry. A payload far past it is refused in the caller's
-- transaction (payload_too_large) rather than queued only to be set aside.
ALTER TABLE tidings.registry_mode ADD COLUMN IF NOT EXISTS max_payload integer;

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
    -- Twice the server's TIDINGS_MAX_PAYLOAD, as each process wrote it at
    -- start-up: PostgreSQL's text form of jsonb has a space after every
    -- `:` and `,` that the server's compact count does not, so the mover
    -- checks the exact size; this keeps the outbox from holding what is
    -- far past it. The other fields together are bounded likewise.
    IF octet_length(payload::text) > 2 * coalesce((SELECT m.max_payload FROM tidings.registry_mode m), 1073741823)
       OR octet_length(coalesce(ref, '') || coalesce(agent_id, '') || coalesce(agent_kind, '') || coalesce(session_id, '')
                       || coalesce(links::text, '')) > 65536 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'payload_too_large',
            DETAIL = format('the event is far past what the server takes (TIDINGS_MAX_PAYLOAD %s bytes)',
                            (SELECT m.max_payload FROM tidings.registry_mode m));
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

REVOKE ALL ON FUNCTION tidings.publish(TEXT, JSONB, TEXT, TEXT, TEXT, TEXT, JSONB, TEXT, TIMESTAMPTZ, TEXT) FROM PUBLIC;
