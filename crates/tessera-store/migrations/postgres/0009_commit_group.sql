-- Tessera store schema on PostgreSQL, version 9 (8 is SQLite's chat log): the writer's group
-- commit as ONE call.
--
-- WHY: the writer's fast path (src/pg/merged.rs) wrote a group as one statement per table,
-- inside BEGIN ... COMMIT: up to ten round trips, each waking a PostgreSQL backend and the
-- writer. Under load a group holds hundreds of turns and that is nothing per turn; at light
-- load a group is one turn, and those wake-ups were most of PostgreSQL's CPU per turn. This
-- function runs the same statements, in the same order, as one statement in its own
-- transaction: one round trip, one commit.
--
-- Same outcome as the statements one by one, or nothing: when a check fails (a stale lease
-- epoch, an unknown chat, a completion without its claim) it raises SQLSTATE 'TS001', the
-- whole group rolls back, and the writer re-runs it job by job so the failing job alone gets
-- its precise error. A duplicate row fails the statement (23505) the same way.
--
-- Answers one row per claim it settled: `won` for claims this call inserted; for claims that
-- existed already (a re-run after a restart, another node), the row's status and result.
CREATE FUNCTION tessera_commit_group(
    fence_chat TEXT[], fence_epoch BIGINT[],
    adds_rows TEXT[],
    m_chat TEXT[], m_idx BIGINT[], m_id TEXT[], m_role TEXT[], m_agent TEXT[],
    m_content TEXT[], m_hidden BOOLEAN[], m_raw TEXT[],
    e_chat TEXT[], e_seq BIGINT[], e_type TEXT[], e_json TEXT[],
    p_chat TEXT[], p_corr TEXT[], p_turn_key TEXT[], p_call TEXT[], p_created BIGINT[],
    p_timeout BIGINT[],
    r_chat TEXT[], r_corr TEXT[],
    s_chat TEXT[], s_status TEXT[], s_agent TEXT[], s_turn BIGINT[], s_consecutive BIGINT[],
    s_context TEXT[], s_updated BIGINT[], completed_status TEXT,
    c_chat TEXT[], c_key TEXT[],
    d_chat TEXT[], d_key TEXT[], d_result TEXT[],
    at_ms BIGINT
) RETURNS TABLE (claim_chat TEXT, claim_key TEXT, won BOOLEAN, claim_status TEXT,
                 claim_result TEXT)
LANGUAGE plpgsql
-- The tables of the schema the function was created in, whatever the caller's search_path.
SET search_path FROM CURRENT
AS $$
DECLARE
    n BIGINT;
    won_chat TEXT[];
    won_key TEXT[];
BEGIN
    -- Lease rows FOR SHARE until COMMIT (a takeover waits for the group to be durable), in
    -- chat id order like a renewal.
    IF cardinality(fence_chat) > 0 THEN
        PERFORM 1 FROM chat_leases AS l
            JOIN UNNEST(fence_chat, fence_epoch) AS f(chat_id, epoch)
            ON l.chat_id = f.chat_id AND l.epoch = f.epoch
            ORDER BY l.chat_id FOR SHARE OF l;
        GET DIAGNOSTICS n = ROW_COUNT;
        IF n <> cardinality(fence_chat) THEN
            RAISE EXCEPTION USING ERRCODE = 'TS001', MESSAGE = 'a lease epoch is stale';
        END IF;
    END IF;
    -- The chats it adds rows to exist, and stay until COMMIT (the lock a foreign key takes).
    IF cardinality(adds_rows) > 0 THEN
        PERFORM 1 FROM chats AS c WHERE c.chat_id = ANY(adds_rows)
            ORDER BY c.chat_id FOR KEY SHARE;
        GET DIAGNOSTICS n = ROW_COUNT;
        IF n <> cardinality(adds_rows) THEN
            RAISE EXCEPTION USING ERRCODE = 'TS001', MESSAGE = 'a chat does not exist';
        END IF;
    END IF;
    IF cardinality(m_chat) > 0 THEN
        INSERT INTO messages (chat_id, idx, message_id, role, agent, content, ui_hidden, raw)
            SELECT * FROM UNNEST(m_chat, m_idx, m_id, m_role, m_agent, m_content, m_hidden,
                                 m_raw);
    END IF;
    IF cardinality(e_chat) > 0 THEN
        INSERT INTO events (chat_id, seq, event_type, json)
            SELECT * FROM UNNEST(e_chat, e_seq, e_type, e_json);
    END IF;
    IF cardinality(p_chat) > 0 THEN
        INSERT INTO pending_ui (chat_id, corr, turn_key, call, created_at_ms, timeout_at_ms)
            SELECT * FROM UNNEST(p_chat, p_corr, p_turn_key, p_call, p_created, p_timeout)
            ON CONFLICT (chat_id, corr) DO UPDATE SET turn_key = EXCLUDED.turn_key,
                call = EXCLUDED.call, created_at_ms = EXCLUDED.created_at_ms,
                timeout_at_ms = EXCLUDED.timeout_at_ms;
    END IF;
    IF cardinality(r_chat) > 0 THEN
        DELETE FROM pending_ui AS p USING UNNEST(r_chat, r_corr) AS r(chat_id, corr)
            WHERE p.chat_id = r.chat_id AND p.corr = r.corr;
    END IF;
    IF cardinality(s_chat) > 0 THEN
        UPDATE chats AS c SET status = s.status, current_agent = s.current_agent,
            turn = s.turn, consecutive = s.consecutive, context = s.context,
            updated_at_ms = s.updated_at_ms, is_open = c.is_open AND s.status <> completed_status
            FROM UNNEST(s_chat, s_status, s_agent, s_turn, s_consecutive, s_context, s_updated)
            AS s(chat_id, status, current_agent, turn, consecutive, context, updated_at_ms)
            WHERE c.chat_id = s.chat_id;
        GET DIAGNOSTICS n = ROW_COUNT;
        IF n <> cardinality(s_chat) THEN
            RAISE EXCEPTION USING ERRCODE = 'TS001', MESSAGE = 'a chat does not exist';
        END IF;
    END IF;
    IF cardinality(c_chat) > 0 THEN
        WITH ins AS (
            INSERT INTO tool_invocations (chat_id, invocation_key, status, started_at_ms)
                SELECT c.chat_id, c.key, 'started', at_ms
                FROM UNNEST(c_chat, c_key) AS c(chat_id, key)
                ON CONFLICT (chat_id, invocation_key) DO NOTHING
                RETURNING tool_invocations.chat_id, tool_invocations.invocation_key
        )
        SELECT array_agg(ins.chat_id), array_agg(ins.invocation_key)
            INTO won_chat, won_key FROM ins;
        RETURN QUERY SELECT w.chat_id, w.key, TRUE, NULL::TEXT, NULL::TEXT
            FROM UNNEST(won_chat, won_key) AS w(chat_id, key);
        GET DIAGNOSTICS n = ROW_COUNT;
        -- Claimed before: rare, so read only then (a statement of its own sees rows that
        -- concurrent transactions committed while the insert waited on them).
        IF n < cardinality(c_chat) THEN
            RETURN QUERY SELECT t.chat_id, t.invocation_key, FALSE, t.status, t.result
                FROM UNNEST(c_chat, c_key) AS c(chat_id, key)
                JOIN tool_invocations AS t
                    ON t.chat_id = c.chat_id AND t.invocation_key = c.key
                WHERE NOT EXISTS (
                    SELECT 1 FROM UNNEST(won_chat, won_key) AS w(chat_id, key)
                    WHERE w.chat_id = c.chat_id AND w.key = c.key);
        END IF;
    END IF;
    IF cardinality(d_chat) > 0 THEN
        UPDATE tool_invocations AS t SET status = 'completed', result = d.result,
            completed_at_ms = at_ms
            FROM UNNEST(d_chat, d_key, d_result) AS d(chat_id, key, result)
            WHERE t.chat_id = d.chat_id AND t.invocation_key = d.key AND t.status = 'started';
        GET DIAGNOSTICS n = ROW_COUNT;
        IF n <> cardinality(d_chat) THEN
            RAISE EXCEPTION USING ERRCODE = 'TS001',
                MESSAGE = 'a completed invocation was not claimed, or completed already';
        END IF;
    END IF;
END;
$$;
