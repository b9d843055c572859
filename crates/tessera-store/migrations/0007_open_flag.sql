-- Tessera store schema, version 7: the open-chat indexes key on a flag that changes once,
-- when the chat completes, instead of on `status`.
--
-- WHY: SQLite rewrites a partial index's entry whenever an UPDATE sets a column its WHERE
-- reads. Every state change sets `status` (running, awaiting_user, ... on each turn), so
-- each one rewrote the chat's entries in `chats_open` and `chats_open_by_tenant`: about 6% of
-- the pages a group commit wrote. `is_open` is set once (a completed chat never reopens).
ALTER TABLE chats ADD COLUMN is_open INTEGER NOT NULL DEFAULT 1;
UPDATE chats SET is_open = 0 WHERE status = 'completed';
DROP INDEX chats_open;
CREATE INDEX chats_open ON chats (created_at_ms) WHERE is_open = 1;
DROP INDEX chats_open_by_tenant;
CREATE INDEX chats_open_by_tenant ON chats (tenant) WHERE is_open = 1;
