-- Tessera store schema on PostgreSQL, version 7 (as SQLite's 0007): the open-chat indexes key
-- on a flag that changes once, when the chat completes, instead of on `status`; and `chats` and
-- `tool_invocations` leave room in each page for updated rows.
--
-- WHY: PostgreSQL can update a row in place (a HOT update: no new index entries) only when no
-- indexed column changes, and a partial index's WHERE counts. Every state change sets `status`
-- (running, awaiting_user, ... on each turn), so each one wrote a new entry into all four of
-- the chat's indexes. `is_open` changes once (a completed chat never reopens). A HOT update
-- also needs free space in the row's page: fillfactor keeps 30% of each page for it (chat
-- states are updated several times a turn, a tool invocation once, when it completes).
ALTER TABLE chats ADD COLUMN is_open BOOLEAN NOT NULL DEFAULT TRUE;
UPDATE chats SET is_open = FALSE WHERE status = 'completed';
DROP INDEX chats_open;
CREATE INDEX chats_open ON chats (created_at_ms, row_no) WHERE is_open;
DROP INDEX chats_open_by_tenant;
CREATE INDEX chats_open_by_tenant ON chats (tenant) WHERE is_open;
ALTER TABLE chats SET (fillfactor = 70);
ALTER TABLE tool_invocations SET (fillfactor = 70);

-- No foreign keys from the chat's rows to `chats`. WHY: PostgreSQL checks a foreign key with
-- a query per inserted row (a trigger: ~14 per turn). The store checks instead, once per
-- chat and transaction: a write to a chat takes the chat's row `FOR KEY SHARE` (or updates
-- it), the lock the foreign key took, so a concurrent delete_chat still waits for the write
-- to commit; and delete_chat deletes the chat's rows itself (src/pg/writes.rs).
ALTER TABLE messages DROP CONSTRAINT IF EXISTS messages_chat_id_fkey;
ALTER TABLE events DROP CONSTRAINT IF EXISTS events_chat_id_fkey;
ALTER TABLE pending_ui DROP CONSTRAINT IF EXISTS pending_ui_chat_id_fkey;
ALTER TABLE tool_invocations DROP CONSTRAINT IF EXISTS tool_invocations_chat_id_fkey;
ALTER TABLE chat_secrets DROP CONSTRAINT IF EXISTS chat_secrets_chat_id_fkey;
