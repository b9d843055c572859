-- Tessera store schema, version 8: a chat's events and transcript are kept as one packed row
-- per flush in `chat_log`, linked to the chat's previous row, instead of one row per event and
-- per message under unique per-chat indexes.
--
-- WHY: the indexes `events_by_chat` and `messages_by_chat` were the last per-chat structures
-- a flush wrote: each chat in a group commit dirtied its own leaf in both, and with the tail
-- pages of two tables that was about half the pages every commit wrote (README, "Where the
-- bytes go"). Here a flush appends one row at the end of one table, in write order, and moves
-- the chat's pointer to it (`chats.log_head`, beside the state the flush updates anyway).
-- Reads walk the chain back from the head, only as far as the seq or idx they start from
-- (`seq_floor` / `idx_floor`: the chat's last seq and next idx before the row). Uniqueness
-- becomes order: a flush's seqs must lie above `chats.last_seq` and its idxs at or above
-- `chats.next_idx`, checked in the write transaction, so it holds across processes too.
--
-- Packed format (the `log` module): per field, its length in bytes as decimal digits, ':',
-- then the bytes. An event is 3 fields (seq, event_type, json); a message 7 (idx, message_id,
-- role, agent as '-' for none or '+' and the name, content, ui_hidden as '0'/'1', raw).

CREATE TABLE chat_log (
    chat_no   INTEGER NOT NULL,
    prev      INTEGER,
    seq_floor INTEGER NOT NULL,
    idx_floor INTEGER NOT NULL,
    events    BLOB,
    messages  BLOB
) STRICT;

ALTER TABLE chats ADD COLUMN log_head INTEGER;
ALTER TABLE chats ADD COLUMN last_seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE chats ADD COLUMN next_idx INTEGER NOT NULL DEFAULT 0;

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

-- Only for the UPDATE below (one lookup per chat instead of a scan); a flush never reads
-- rows by chat number.
CREATE INDEX chat_log_by_chat_during_migration ON chat_log (chat_no);
UPDATE chats SET
    log_head = (SELECT l.rowid FROM chat_log l JOIN chat_numbers n ON n.chat_no = l.chat_no
                WHERE n.chat_id = chats.chat_id),
    last_seq = COALESCE((SELECT MAX(e.seq) FROM events e JOIN chat_numbers n
                         ON n.chat_no = e.chat_no WHERE n.chat_id = chats.chat_id), 0),
    next_idx = COALESCE((SELECT MAX(m.idx) + 1 FROM messages m JOIN chat_numbers n
                         ON n.chat_no = m.chat_no WHERE n.chat_id = chats.chat_id), 0);

DROP INDEX chat_log_by_chat_during_migration;
DROP TABLE events;
DROP TABLE messages;
