-- The W3C trace context at the SQL door (docs/tracing.md): tidings.publish
-- takes `traceparent` and `tracestate` arguments, which default to the
-- session settings `tidings.traceparent` and `tidings.tracestate`, so that
-- an application whose tracer sets them for its transaction reaches the
-- outbox without changing its calls. The outbox row keeps them beside its
-- event (not in it: a retry in another trace is the same publish for its
-- idempotency key), and the mover checks them again.
--
-- A function's arguments are part of its name: the old one is dropped and
-- the new one created, and every role that could execute the old one is
-- granted the new one, so that no application loses its right to publish.
ALTER TABLE tidings.outbox ADD COLUMN IF NOT EXISTS traceparent TEXT, ADD COLUMN IF NOT EXISTS tracestate TEXT;

CREATE TEMP TABLE tidings_publish_grantees ON COMMIT DROP AS
SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END AS grantee
  FROM pg_proc p
 CROSS JOIN LATERAL aclexplode(p.proacl) a
  LEFT JOIN pg_roles r ON r.oid = a.grantee
 WHERE p.oid = 'tidings.publish(text,jsonb,text,text,text,text,jsonb,text,timestamptz,text)'::regprocedure
   AND a.privilege_type = 'EXECUTE'
   AND a.grantee <> p.proowner;

DROP FUNCTION tidings.publish(TEXT, JSONB, TEXT, TEXT, TEXT, TEXT, JSONB, TEXT, TIMESTAMPTZ, TEXT);

CREATE FUNCTION tidings.publish(
    event_type      TEXT,
    payload         JSONB       DEFAULT '{}',
    ref             TEXT        DEFAULT NULL,
    agent_id        TEXT        DEFAULT NULL,
    agent_kind      TEXT        DEFAULT NULL,
    session_id      TEXT        DEFAULT NULL,
    links           JSONB       DEFAULT '[]',
    visibility      TEXT        DEFAULT 'public',
    occurred_at     TIMESTAMPTZ DEFAULT NULL,
    idempotency_key TEXT        DEFAULT NULL,
    traceparent     TEXT        DEFAULT NULL,
    tracestate      TEXT        DEFAULT NULL
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
    -- The W3C trace context: the arguments, else the session's settings
    -- (an empty one is none), checked as the HTTP door checks its headers.
    IF nullif(traceparent, '') IS NULL THEN
        traceparent := nullif(current_setting('tidings.traceparent', true), '');
        tracestate := coalesce(nullif(tracestate, ''), nullif(current_setting('tidings.tracestate', true), ''));
    END IF;
    tracestate := nullif(tracestate, '');
    IF traceparent IS NOT NULL AND (traceparent !~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
       OR substr(traceparent, 4, 32) = repeat('0', 32) OR substr(traceparent, 37, 16) = repeat('0', 16)) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'invalid_traceparent',
            DETAIL = 'traceparent must be 00-<32 lowercase hex>-<16 lowercase hex>-<2 lowercase hex>, with ids that are not all zeros';
    END IF;
    IF tracestate IS NOT NULL AND (octet_length(tracestate) > 512 OR tracestate !~ '^(?:[a-z][a-z0-9_*/-]{0,255}|[a-z0-9][a-z0-9_*/-]{0,240}@[a-z][a-z0-9_*/-]{0,13})=[ -+\--<>-~]{0,255}[!-+\--<>-~](?:[ \t]*,[ \t]*(?:[a-z][a-z0-9_*/-]{0,255}|[a-z0-9][a-z0-9_*/-]{0,240}@[a-z][a-z0-9_*/-]{0,13})=[ -+\--<>-~]{0,255}[!-+\--<>-~]){0,31}$') THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'invalid_tracestate',
            DETAIL = 'tracestate must be 1 to 32 comma-separated key=value members of the W3C grammar, at most 512 bytes';
    END IF;
    IF idempotency_key IS NOT NULL AND idempotency_key !~ '^[!-~]{1,255}$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'invalid_idempotency_key',
            DETAIL = 'an idempotency key is 1 to 255 visible ASCII characters';
    END IF;
    INSERT INTO tidings.outbox (event, idempotency_key, publisher, traceparent, tracestate)
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
        session_user,
        traceparent,
        CASE WHEN traceparent IS NULL THEN NULL ELSE tracestate END
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

REVOKE ALL ON FUNCTION tidings.publish(TEXT, JSONB, TEXT, TEXT, TEXT, TEXT, JSONB, TEXT, TIMESTAMPTZ, TEXT, TEXT, TEXT) FROM PUBLIC;

DO $$
DECLARE
    who TEXT;
BEGIN
    FOR who IN SELECT grantee FROM tidings_publish_grantees LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION tidings.publish(TEXT, JSONB, TEXT, TEXT, TEXT, TEXT, JSONB, TEXT, TIMESTAMPTZ, TEXT, TEXT, TEXT) TO %s', who);
    END LOOP;
END;
$$;
