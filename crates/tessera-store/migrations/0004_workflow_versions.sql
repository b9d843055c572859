-- Tessera store schema, version 4: every workflow version a node served, with its manifest
-- files, so any node (and a restarted one) can compile the version a stored chat started
-- with even when its own workflows folder has changed since. Written once per version.

CREATE TABLE workflow_versions (
    name          TEXT    NOT NULL,
    version       TEXT    NOT NULL,
    -- JSON object: manifest file name -> its text.
    files         TEXT    NOT NULL,
    created_at_ms INTEGER NOT NULL,
    PRIMARY KEY (name, version)
) STRICT;
