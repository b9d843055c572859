-- Tessera store schema, version 5: the event log, the transcript and the tool claims laid
-- out in write order.
--
-- WHY: clustered by chat id (WITHOUT ROWID, primary key (chat_id, ...)), every group commit
-- dirtied one page per active chat in each of these tables, and every such page went to the
-- WAL and again to the database at checkpoint (~92 KiB written per turn to keep ~5 KiB).
-- As rowid tables their rows are appended where the last commit left off, and the only
-- per-chat structure left is a unique index of small integer keys (chat number, seq), which
-- packs hundreds of chats into one page. Version 4 is left to the workflow-versions change.

-- A small integer per chat for those indexes (a 36-character chat id in every index entry
-- made them four times larger). Not chats.rowid: VACUUM may renumber an implicit rowid.
CREATE TABLE chat_numbers (
    chat_no INTEGER NOT NULL PRIMARY KEY,
    chat_id TEXT    NOT NULL UNIQUE REFERENCES chats (chat_id) ON DELETE CASCADE
) STRICT;
INSERT INTO chat_numbers (chat_id) SELECT chat_id FROM chats ORDER BY rowid;

CREATE TABLE events_by_write (
    chat_no    INTEGER NOT NULL REFERENCES chat_numbers (chat_no) ON DELETE CASCADE,
    seq        INTEGER NOT NULL,
    event_type TEXT    NOT NULL,
    json       TEXT    NOT NULL
) STRICT;
INSERT INTO events_by_write (chat_no, seq, event_type, json)
    SELECT n.chat_no, e.seq, e.event_type, e.json
    FROM events e JOIN chat_numbers n ON n.chat_id = e.chat_id
    ORDER BY n.chat_no, e.seq;
DROP TABLE events;
ALTER TABLE events_by_write RENAME TO events;
CREATE UNIQUE INDEX events_by_chat ON events (chat_no, seq);

CREATE TABLE messages_by_write (
    chat_no    INTEGER NOT NULL REFERENCES chat_numbers (chat_no) ON DELETE CASCADE,
    idx        INTEGER NOT NULL,
    message_id TEXT    NOT NULL,
    role       TEXT    NOT NULL,
    agent      TEXT,
    content    TEXT    NOT NULL,
    ui_hidden  INTEGER NOT NULL,
    raw        TEXT    NOT NULL
) STRICT;
INSERT INTO messages_by_write (chat_no, idx, message_id, role, agent, content, ui_hidden, raw)
    SELECT n.chat_no, m.idx, m.message_id, m.role, m.agent, m.content, m.ui_hidden, m.raw
    FROM messages m JOIN chat_numbers n ON n.chat_id = m.chat_id
    ORDER BY n.chat_no, m.idx;
DROP TABLE messages;
ALTER TABLE messages_by_write RENAME TO messages;
CREATE UNIQUE INDEX messages_by_chat ON messages (chat_no, idx);

CREATE TABLE tool_invocations_by_write (
    chat_no         INTEGER NOT NULL REFERENCES chat_numbers (chat_no) ON DELETE CASCADE,
    invocation_key  TEXT    NOT NULL,
    status          TEXT    NOT NULL CHECK (status IN ('started', 'completed')),
    result          TEXT,
    started_at_ms   INTEGER NOT NULL,
    completed_at_ms INTEGER
) STRICT;
INSERT INTO tool_invocations_by_write
    (chat_no, invocation_key, status, result, started_at_ms, completed_at_ms)
    SELECT n.chat_no, t.invocation_key, t.status, t.result, t.started_at_ms, t.completed_at_ms
    FROM tool_invocations t JOIN chat_numbers n ON n.chat_id = t.chat_id
    ORDER BY t.started_at_ms;
DROP TABLE tool_invocations;
ALTER TABLE tool_invocations_by_write RENAME TO tool_invocations;
CREATE UNIQUE INDEX tool_invocations_by_chat ON tool_invocations (chat_no, invocation_key);
