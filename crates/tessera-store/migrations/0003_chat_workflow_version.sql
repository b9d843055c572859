-- Tessera store schema, version 3: the workflow version each chat started with, so a chat
-- keeps its version when the workflow is reloaded and gets it back after a restart.
-- '' for chats created before this version (they run the workflow's current version).

ALTER TABLE chats ADD COLUMN workflow_version TEXT NOT NULL DEFAULT '';
