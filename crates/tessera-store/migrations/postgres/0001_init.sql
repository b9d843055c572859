-- Tessera store schema on PostgreSQL, version 1: the same records as the SQLite schema
-- (migrations/0001_init.sql to 0003_chat_workflow_version.sql) plus the chats' leases.
-- Never edit a shipped migration: add a new numbered file and list it in src/pg/migrate.rs.
-- JSON stays TEXT, as on SQLite: the store never looks inside it, and parsing it into jsonb
-- on every write would cost CPU for nothing.

CREATE TABLE chats (
    chat_id        TEXT    NOT NULL PRIMARY KEY,
    -- insertion order, the tie-break of equal creation times (SQLite's rowid)
    row_no         BIGINT  GENERATED ALWAYS AS IDENTITY,
    tenant         TEXT    NOT NULL,
    user_id        TEXT    NOT NULL,
    workflow       TEXT    NOT NULL,
    -- the workflow version the chat started with ('' = the current one)
    workflow_version TEXT  NOT NULL DEFAULT '',
    created_at_ms  BIGINT  NOT NULL,
    status         TEXT    NOT NULL,
    current_agent  TEXT    NOT NULL,
    turn           BIGINT  NOT NULL,
    consecutive    BIGINT  NOT NULL,
    context        TEXT    NOT NULL,
    updated_at_ms  BIGINT  NOT NULL
);

CREATE INDEX chats_by_owner ON chats (tenant, user_id, created_at_ms DESC, row_no DESC);
CREATE INDEX chats_open ON chats (created_at_ms, row_no) WHERE status <> 'completed';

CREATE TABLE messages (
    chat_id    TEXT    NOT NULL REFERENCES chats (chat_id) ON DELETE CASCADE,
    idx        BIGINT  NOT NULL,
    message_id TEXT    NOT NULL,
    role       TEXT    NOT NULL,
    agent      TEXT,
    content    TEXT    NOT NULL,
    ui_hidden  BOOLEAN NOT NULL,
    raw        TEXT    NOT NULL,
    PRIMARY KEY (chat_id, idx)
);

CREATE TABLE events (
    chat_id    TEXT    NOT NULL REFERENCES chats (chat_id) ON DELETE CASCADE,
    seq        BIGINT  NOT NULL,
    event_type TEXT    NOT NULL,
    json       TEXT    NOT NULL,
    PRIMARY KEY (chat_id, seq)
);

CREATE TABLE pending_ui (
    chat_id       TEXT    NOT NULL REFERENCES chats (chat_id) ON DELETE CASCADE,
    corr          TEXT    NOT NULL,
    turn_key      TEXT    NOT NULL,
    call          TEXT    NOT NULL,
    created_at_ms BIGINT  NOT NULL,
    timeout_at_ms BIGINT,
    PRIMARY KEY (chat_id, corr)
);

-- The exactly-once gate: one row per (chat, invocation key), inserted before the tool runs.
CREATE TABLE tool_invocations (
    chat_id         TEXT    NOT NULL REFERENCES chats (chat_id) ON DELETE CASCADE,
    invocation_key  TEXT    NOT NULL,
    status          TEXT    NOT NULL CHECK (status IN ('started', 'completed')),
    result          TEXT,
    started_at_ms   BIGINT  NOT NULL,
    completed_at_ms BIGINT,
    PRIMARY KEY (chat_id, invocation_key)
);

CREATE TABLE tasks (
    id            TEXT    NOT NULL PRIMARY KEY,
    row_no        BIGINT  GENERATED ALWAYS AS IDENTITY,
    tenant        TEXT    NOT NULL,
    user_id       TEXT    NOT NULL,
    title         TEXT    NOT NULL,
    description   TEXT,
    completed     BOOLEAN NOT NULL,
    created_at_ms BIGINT  NOT NULL
);

CREATE INDEX tasks_by_owner ON tasks (tenant, user_id, created_at_ms, row_no);

-- No foreign key to chats, as on SQLite: a tool may store a file for a chat the engine has
-- not persisted; delete_chat removes them explicitly.
CREATE TABLE artifacts (
    id            TEXT    NOT NULL PRIMARY KEY,
    tenant        TEXT    NOT NULL,
    user_id       TEXT    NOT NULL,
    chat_id       TEXT    NOT NULL,
    file_name     TEXT    NOT NULL,
    size          BIGINT  NOT NULL,
    sha256        TEXT    NOT NULL,
    bytes         BYTEA   NOT NULL,
    created_at_ms BIGINT  NOT NULL
);

CREATE INDEX artifacts_by_chat ON artifacts (chat_id);

-- Sealed (encrypted by the engine) secret vaults; never a secret in clear.
CREATE TABLE chat_secrets (
    chat_id       TEXT    NOT NULL PRIMARY KEY REFERENCES chats (chat_id) ON DELETE CASCADE,
    sealed        BYTEA   NOT NULL,
    updated_at_ms BIGINT  NOT NULL
);

-- Which node owns each open chat (see LeaseStore). No foreign key to chats: a node may take
-- a chat's lease before the chat row is written. `expires_at` is the database's clock.
CREATE TABLE chat_leases (
    chat_id    TEXT        NOT NULL PRIMARY KEY,
    node       TEXT        NOT NULL,
    epoch      BIGINT      NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);
