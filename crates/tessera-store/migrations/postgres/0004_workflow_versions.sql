-- Tessera store schema, version 4 (as SQLite's 0004): every workflow version a node served,
-- with its manifest files, so any node can compile the version a stored chat started with.
-- Written once per version. (Versions 2 and 3 exist on SQLite only: PostgreSQL's 0001
-- already has what they add.)

CREATE TABLE workflow_versions (
    name          TEXT    NOT NULL,
    version       TEXT    NOT NULL,
    -- JSON object: manifest file name -> its text.
    files         TEXT    NOT NULL,
    created_at_ms BIGINT  NOT NULL,
    PRIMARY KEY (name, version)
);
