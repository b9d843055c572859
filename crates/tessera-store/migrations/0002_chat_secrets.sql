-- Tessera store schema, version 2: the chats' sealed secret vaults.
-- `sealed` is ChaCha20-Poly1305 ciphertext made by the engine (version || nonce || ciphertext,
-- bound to the chat id); this database never holds a secret in clear. One row per chat,
-- deleted when the chat completes (and with the chat).

CREATE TABLE chat_secrets (
    chat_id       TEXT    NOT NULL PRIMARY KEY REFERENCES chats (chat_id) ON DELETE CASCADE,
    sealed        BLOB    NOT NULL,
    updated_at_ms INTEGER NOT NULL
) STRICT;
