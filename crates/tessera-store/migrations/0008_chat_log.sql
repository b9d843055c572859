-- Tessera store schema, version 8: what a flush writes lands at the end of the file, plus one
-- small entry per chat in a dense table, instead of on pages of its own.
--
-- WHY: every chat in a group commit dirtied its own leaf in `events_by_chat` and
-- `messages_by_chat` and its own `chats` row page (a chats row holds the context JSON, ~15
-- per page): with the tail pages of two tables, most of the pages a commit wrote (README,
-- "Where the bytes go"). Now:
-- * `chat_log`: one packed row per flush with the flush's events, transcript messages and
--   new state, appended in write order and linked to the chat's previous row (`prev`).
-- * `chat_heads`: per chat only integers (the newest log row, the row with the latest state,
--   the last seq, the next idx), ~250 chats per page, so the chats of one commit share pages.
-- * `tool_invocations`: a claim is a row appended in write order; the chat's newest claims
--   (up to 16) are chained from `chat_heads.claims_head` and found by walking that chain,
--   then their keys go to `tool_invocation_keys` together, one index leaf for 16 claims
--   instead of one per claim. A claim is looked for in both; the check and the insert run in
--   one write transaction, so a key is still claimed once across processes.
-- * `chats` keeps identity and the state at creation, and again at completion (what the
--   listing and retention queries read); the state of an open chat is its `state_row`'s.
-- Reads walk the chain back from the head, only as far as the seq or idx they start from
-- (`seq_floor` / `idx_floor`: the chat's last seq and next idx before the row). Uniqueness
-- becomes order: a flush's seqs must lie above `last_seq` and its idxs at or above
-- `next_idx`, checked in the write transaction, so it holds across processes too.
--
-- Packed format (the `log` module): per field, its length in bytes as decimal digits, ':',
-- then the bytes. An event is 3 fields (seq, event_type, json); a message 7 (idx, message_id,
-- role, agent as '-' for none or '+' and the name, content, ui_hidden as '0'/'1', raw); a
-- state 6 (status, current_agent, turn, consecutive, context, updated_at_ms).

CREATE TABLE chat_log (
    chat_no   INTEGER NOT NULL,
    prev      INTEGER,
    seq_floor INTEGER NOT NULL,
    idx_floor INTEGER NOT NULL,
    -- Smallest first: SQLite reaches a column by stepping over the ones before it, through
    -- their overflow pages when a row is larger than a page.
    state     BLOB,
    messages  BLOB,
    events    BLOB
) STRICT;

CREATE TABLE chat_heads (
    chat_no   INTEGER NOT NULL PRIMARY KEY REFERENCES chat_numbers (chat_no) ON DELETE CASCADE,
    log_head  INTEGER,
    state_row INTEGER,
    last_seq  INTEGER NOT NULL,
    next_idx  INTEGER NOT NULL,
    claims_head      INTEGER,
    unindexed_claims INTEGER NOT NULL DEFAULT 0
) STRICT;

-- Claims keep their rowids (and so their write order); all existing ones are indexed. No
-- foreign key: deleting a chat removes its claims explicitly (a cascade would scan).
CREATE TABLE tool_invocations_chained (
    chat_no         INTEGER NOT NULL,
    invocation_key  TEXT    NOT NULL,
    status          TEXT    NOT NULL CHECK (status IN ('started', 'completed')),
    result          TEXT,
    started_at_ms   INTEGER NOT NULL,
    completed_at_ms INTEGER,
    prev            INTEGER
) STRICT;
INSERT INTO tool_invocations_chained
    (rowid, chat_no, invocation_key, status, result, started_at_ms, completed_at_ms, prev)
    SELECT rowid, chat_no, invocation_key, status, result, started_at_ms, completed_at_ms, NULL
    FROM tool_invocations;
DROP TABLE tool_invocations;
ALTER TABLE tool_invocations_chained RENAME TO tool_invocations;

CREATE TABLE tool_invocation_keys (
    chat_no        INTEGER NOT NULL REFERENCES chat_numbers (chat_no) ON DELETE CASCADE,
    invocation_key TEXT    NOT NULL,
    claim_row      INTEGER NOT NULL,
    PRIMARY KEY (chat_no, invocation_key)
) STRICT, WITHOUT ROWID;
INSERT INTO tool_invocation_keys (chat_no, invocation_key, claim_row)
    SELECT chat_no, invocation_key, rowid FROM tool_invocations;

-- Each existing chat's history becomes one row.
INSERT INTO chat_log (chat_no, prev, seq_floor, idx_floor, events, messages)
SELECT n.chat_no, NULL, 0, 0,
    (SELECT CAST(group_concat(
                length(CAST(e.seq AS TEXT)) || ':' || e.seq
                || length(CAST(e.event_type AS BLOB)) || ':' || e.event_type
                || length(CAST(e.json AS BLOB)) || ':' || e.json, '' ORDER BY e.seq) AS BLOB)
     FROM events e WHERE e.chat_no = n.chat_no),
    (SELECT CAST(group_concat(
                length(CAST(m.idx AS TEXT)) || ':' || m.idx
                || length(CAST(m.message_id AS BLOB)) || ':' || m.message_id
                || length(CAST(m.role AS BLOB)) || ':' || m.role
                || CASE WHEN m.agent IS NULL THEN '1:-'
                        ELSE (length(CAST(m.agent AS BLOB)) + 1) || ':+' || m.agent END
                || length(CAST(m.content AS BLOB)) || ':' || m.content
                || '1:' || CASE WHEN m.ui_hidden THEN '1' ELSE '0' END
                || length(CAST(m.raw AS BLOB)) || ':' || m.raw, '' ORDER BY m.idx) AS BLOB)
     FROM messages m WHERE m.chat_no = n.chat_no)
FROM chat_numbers n
WHERE EXISTS (SELECT 1 FROM events e WHERE e.chat_no = n.chat_no)
   OR EXISTS (SELECT 1 FROM messages m WHERE m.chat_no = n.chat_no)
ORDER BY n.chat_no;

-- Only for the INSERT below (one lookup per chat instead of a scan); a flush never reads
-- rows by chat number.
CREATE INDEX chat_log_by_chat_during_migration ON chat_log (chat_no);
INSERT INTO chat_heads (chat_no, log_head, state_row, last_seq, next_idx)
SELECT n.chat_no,
    (SELECT l.rowid FROM chat_log l WHERE l.chat_no = n.chat_no),
    NULL,
    COALESCE((SELECT MAX(e.seq) FROM events e WHERE e.chat_no = n.chat_no), 0),
    COALESCE((SELECT MAX(m.idx) + 1 FROM messages m WHERE m.chat_no = n.chat_no), 0)
FROM chat_numbers n;

DROP INDEX chat_log_by_chat_during_migration;
DROP TABLE events;
DROP TABLE messages;
