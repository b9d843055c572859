-- Tessera store schema on PostgreSQL, version 11: a chat's seqs can be taken without their
-- events stored (`chats.seqs_taken`, the highest seq marked taken; 0: none beyond the last
-- event's). SQLite's migration 11 says why: a single node sends streamed deltas live only and
-- marks their seqs taken ahead, in steps, so a chat rebuilt after a crash reuses no seq a
-- client saw.
--
-- The group commit takes the marks as two more arrays: an overload of version 9's function
-- that calls it, then sets each chat's mark. Version 9's signature stays,
-- so a node still running the previous build keeps committing during a rolling upgrade.
ALTER TABLE chats ADD COLUMN seqs_taken BIGINT NOT NULL DEFAULT 0;

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
    at_ms BIGINT,
    t_chat TEXT[], t_seq BIGINT[]
) RETURNS TABLE (claim_chat TEXT, claim_key TEXT, won BOOLEAN, claim_status TEXT,
                 claim_result TEXT)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN QUERY SELECT * FROM tessera_commit_group(fence_chat, fence_epoch, adds_rows,
        m_chat, m_idx, m_id, m_role, m_agent, m_content, m_hidden, m_raw,
        e_chat, e_seq, e_type, e_json,
        p_chat, p_corr, p_turn_key, p_call, p_created, p_timeout,
        r_chat, r_corr,
        s_chat, s_status, s_agent, s_turn, s_consecutive, s_context, s_updated,
        completed_status, c_chat, c_key, d_chat, d_key, d_result, at_ms);
    -- One entry per chat (the caller keeps each chat's last); a deleted chat has no row to
    -- mark, and needs none.
    IF cardinality(t_chat) > 0 THEN
        UPDATE chats AS c SET seqs_taken = t.seq
            FROM UNNEST(t_chat, t_seq) AS t(chat_id, seq)
            WHERE c.chat_id = t.chat_id AND c.seqs_taken <> t.seq;
    END IF;
END;
$$;
