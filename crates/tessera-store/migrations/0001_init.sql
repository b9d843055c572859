-- Tessera store schema, version 1.
-- Never edit a shipped migration: add a new numbered file and list it in src/migrate.rs.

CREATE TABLE chats (
    chat_id        TEXT    NOT NULL PRIMARY KEY,
    tenant         TEXT    NOT NULL,
    user_id        TEXT    NOT NULL,
    workflow       TEXT    NOT NULL,
    created_at_ms  INTEGER NOT NULL,
    status         TEXT    NOT NULL,
    current_agent  TEXT    NOT NULL,
    turn           INTEGER NOT NULL,
    consecutive    INTEGER NOT NULL,
    context        TEXT    NOT NULL,
    updated_at_ms  INTEGER NOT NULL
) STRICT;

-- list_chats: one owner's chats, newest first.
CREATE INDEX chats_by_owner ON chats (tenant, user_id, created_at_ms DESC);
-- list_open_chats: only the (few) chats that are not completed.
CREATE INDEX chats_open ON chats (created_at_ms) WHERE status <> 'completed';

CREATE TABLE messages (
    chat_id    TEXT    NOT NULL REFERENCES chats (chat_id) ON DELETE CASCADE,
    idx        INTEGER NOT NULL,
    message_id TEXT    NOT NULL,
    role       TEXT    NOT NULL,
    agent      TEXT,
    content    TEXT    NOT NULL,
    ui_hidden  INTEGER NOT NULL,
    raw        TEXT    NOT NULL,
    PRIMARY KEY (chat_id, idx)
) STRICT, WITHOUT ROWID;

CREATE TABLE events (
    chat_id    TEXT    NOT NULL REFERENCES chats (chat_id) ON DELETE CASCADE,
    seq        INTEGER NOT NULL,
    event_type TEXT    NOT NULL,
    json       TEXT    NOT NULL,
    PRIMARY KEY (chat_id, seq)
) STRICT, WITHOUT ROWID;

CREATE TABLE pending_ui (
    chat_id       TEXT    NOT NULL REFERENCES chats (chat_id) ON DELETE CASCADE,
    corr          TEXT    NOT NULL,
    turn_key      TEXT    NOT NULL,
    call          TEXT    NOT NULL,
    created_at_ms INTEGER NOT NULL,
    timeout_at_ms INTEGER,
    PRIMARY KEY (chat_id, corr)
) STRICT, WITHOUT ROWID;

CREATE TABLE tool_invocations (
    chat_id         TEXT    NOT NULL REFERENCES chats (chat_id) ON DELETE CASCADE,
    invocation_key  TEXT    NOT NULL,
    status          TEXT    NOT NULL CHECK (status IN ('started', 'completed')),
    result          TEXT,
    started_at_ms   INTEGER NOT NULL,
    completed_at_ms INTEGER,
    PRIMARY KEY (chat_id, invocation_key)
) STRICT, WITHOUT ROWID;

-- Todo lists of the task built-ins; scoped by owner, not by chat.
CREATE TABLE tasks (
    id            TEXT    NOT NULL PRIMARY KEY,
    tenant        TEXT    NOT NULL,
    user_id       TEXT    NOT NULL,
    title         TEXT    NOT NULL,
    description   TEXT,
    completed     INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL
) STRICT;

CREATE INDEX tasks_by_owner ON tasks (tenant, user_id, created_at_ms);

-- Files produced by tools. No foreign key to chats: a tool may store a file for a chat the
-- engine has not persisted; delete_chat removes them explicitly.
CREATE TABLE artifacts (
    id            TEXT    NOT NULL PRIMARY KEY,
    tenant        TEXT    NOT NULL,
    user_id       TEXT    NOT NULL,
    chat_id       TEXT    NOT NULL,
    file_name     TEXT    NOT NULL,
    size          INTEGER NOT NULL,
    sha256        TEXT    NOT NULL,
    bytes         BLOB    NOT NULL,
    created_at_ms INTEGER NOT NULL
) STRICT;

CREATE INDEX artifacts_by_chat ON artifacts (chat_id);
