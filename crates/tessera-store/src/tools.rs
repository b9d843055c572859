//! SQL for the tool claims: the exactly-once gate for tool side effects (migration 8).
//!
//! Protocol: `claim` writes a 'started' row BEFORE the tool runs, `complete` marks it
//! 'completed' with the result after. A row still 'started' after a crash means the call was
//! interrupted and must not be re-run.
//!
//! Layout: a claim is a row of `tool_invocations` appended in write order. The chat's newest
//! claims, up to [`UNINDEXED_CLAIMS`], are chained from its `chat_heads` row (`claims_head`,
//! each row's `prev`); when the chain is full its keys go to `tool_invocation_keys` together.
//! WHY: one index entry per claim dirtied an index leaf per chat in every group commit; this
//! way a claim dirties the table's tail and the chat's small heads row (shared with other
//! chats), and the index one leaf per [`UNINDEXED_CLAIMS`] claims.
//!
//! A key is looked for in the chain and in the index (if the chat has indexed keys at all: the
//! heads say). Each claim row carries a filter of the keys of the chain up to it
//! (`chain_filter`, migration 10: a 64-bit Bloom filter), so the walk stops at the first row
//! whose filter rules the key out. The head's filter comes with the chat's heads (which the
//! writer keeps between transactions, see `db`), so a claim of a new key, the usual case, reads
//! no chain row at all; and a completion of the newest claim or of the one before it (the heads
//! carry its row too), the usual ones, is written by its row at once. On SQLite's own path a
//! new claim is appended to the claims journal under its file lock, after a look into the
//! database and the journal (`claims_journal`), and its row is inserted by the next group
//! transaction; a claim answered inside a transaction ([`claim`]) checks and inserts inside the
//! writer's `BEGIN IMMEDIATE`. Either way at most one caller ever claims a key, across stores
//! and processes.

use rusqlite::{OptionalExtension, params};

use crate::convert::{json_from_sql, now_ms};
use crate::db::{Db, Held};
use crate::log::{Heads, heads};
use crate::{StoreError, ToolClaim};

/// Claims a chat keeps chained (found by walking) before their keys are indexed.
const UNINDEXED_CLAIMS: i64 = 16;

/// `$rest` after a CTE `walk(r)`: the rowids of the chain of claims starting at `?1`.
macro_rules! walk_chain {
    ($rest:literal) => {
        concat!(
            "WITH RECURSIVE walk(r) AS (SELECT ?1 UNION ALL ",
            "SELECT t.prev FROM walk w JOIN tool_invocations t ON t.rowid = w.r ",
            "WHERE t.prev IS NOT NULL) ",
            $rest
        )
    };
}

/// [`find`]'s step along a chat's chain of claims.
pub(crate) const CLAIM_IN_CHAIN_SQL: &str = "SELECT invocation_key = ?2, status, result, prev, \
     chain_filter FROM tool_invocations WHERE rowid = ?1";
/// [`find`]'s look-up in the index of older keys.
pub(crate) const CLAIM_BY_INDEX_SQL: &str = "SELECT t.rowid, t.status, t.result \
     FROM tool_invocation_keys k JOIN tool_invocations t ON t.rowid = k.claim_row \
     WHERE k.chat_no = ? AND k.invocation_key = ?";
/// [`insert`]'s new claim (`?5`: its [`chain_filter`]).
pub(crate) const INSERT_CLAIM_SQL: &str = "INSERT INTO tool_invocations \
     (chat_no, invocation_key, status, started_at_ms, prev, chain_filter) \
     VALUES (?1, ?2, 'started', ?3, ?4, ?5)";
/// [`insert`]'s move of the chat's chain.
pub(crate) const MOVE_CLAIMS_HEAD_SQL: &str =
    "UPDATE chat_heads SET claims_head = ?, unindexed_claims = ? WHERE chat_no = ?";
/// [`complete`]'s update.
pub(crate) const COMPLETE_CLAIM_SQL: &str = "UPDATE tool_invocations SET status = 'completed', \
     result = ?, completed_at_ms = ? WHERE rowid = ?";
/// [`complete`]'s update of the chat's newest claim or the one before it (`?3`), if it is the
/// key's and still started.
pub(crate) const COMPLETE_RECENT_CLAIM_SQL: &str = "UPDATE tool_invocations \
     SET status = 'completed', result = ?1, completed_at_ms = ?2 \
     WHERE rowid = ?3 AND chat_no = ?4 AND invocation_key = ?5 AND status = 'started'";

/// The bits `key` sets in a chain's filter: two of 64, from FNV-1a (64-bit) with a final mix.
/// Part of the stored format (migration 10): changing it needs a migration that forgets every
/// stored filter.
fn filter_bits(key: &str) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in key.as_bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // FNV's low bits depend little on the last bytes, where keys differ (`...:s3:0`).
    hash ^= hash >> 29;
    hash = hash.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash ^= hash >> 32;
    ((1u64 << (hash & 63)) | (1u64 << ((hash >> 6) & 63))) as i64
}

/// The filter of a claim of `key` chained after the head whose filter is `head_filter`: the
/// head's plus the key's own bits, or the key's bits alone at a chain's start (`head` is
/// `None`); none after a head without one, so a chain begun without filters (before
/// migration 10) gets none until it is indexed. Every filter thus holds the bits of its own
/// key and of every older key of its chain.
fn chain_filter(head: Option<i64>, head_filter: Option<i64>, key: &str) -> Option<i64> {
    let bits = filter_bits(key);
    match head {
        None => Some(bits),
        Some(_) => head_filter.map(|filter| filter | bits),
    }
}

/// A stored claim.
struct Found {
    row: i64,
    status: String,
    result: Option<String>,
}

/// The claim of `key`, from the chain of unindexed claims or from the index.
///
/// The chain is walked here a row at a time, newest first, rather than by a recursive query:
/// SQLite runs one of those through a queue table, which cost ~1.4 µs per claim walked.
/// Stepping one cached statement costs a rowid look-up per claim; a key claimed last (its
/// completion) is found at once, and a new key (most look-ups) is ruled out by the head's
/// filter.
fn find(db: &Db<'_>, claims: &Heads, key: &str) -> Result<Option<Found>, StoreError> {
    /// One claim of the chain: the one looked for, or the next older one.
    enum Step {
        Found(Found),
        Older(Option<i64>),
    }
    let mut next = claims.claims_head;
    let bits = filter_bits(key);
    // The head's filter came with the heads: when it rules the key out, the walk's first
    // step would stop there (its filter holds its own key's bits too, see `chain_filter`),
    // so it is not taken.
    if claims
        .head_filter
        .is_some_and(|filter| filter & bits != bits)
    {
        next = None;
    }
    if next.is_some() {
        // The chain holds `unindexed_claims` rows, at most `UNINDEXED_CLAIMS`; should it be
        // longer, the recursive query below walks the rest.
        let walked = db.with(Held::ClaimInChain, |chained| {
            for _ in 0..claims.unindexed_claims.max(UNINDEXED_CLAIMS) {
                let Some(row) = next else { break };
                let step = chained
                    .query_row(params![row, key], |r| {
                        if r.get::<_, bool>(0)? {
                            Ok(Step::Found(Found {
                                row,
                                status: r.get(1)?,
                                result: r.get(2)?,
                            }))
                        } else if r
                            .get::<_, Option<i64>>(4)?
                            .is_some_and(|filter| filter & bits != bits)
                        {
                            // Neither this row nor any older one of the chain holds the key.
                            Ok(Step::Older(None))
                        } else {
                            Ok(Step::Older(r.get(3)?))
                        }
                    })
                    .optional()?;
                match step {
                    Some(Step::Found(found)) => return Ok(Some(found)),
                    Some(Step::Older(prev)) => next = prev,
                    None => next = None,
                }
            }
            Ok(None)
        })?;
        if walked.is_some() {
            return Ok(walked);
        }
    }
    if let Some(rest) = next {
        let chained = db
            .prepare_cached(walk_chain!(
                "SELECT t.rowid, t.status, t.result FROM walk w \
                 JOIN tool_invocations t ON t.rowid = w.r WHERE t.invocation_key = ?2"
            ))?
            .query_row(params![rest, key], found)
            .optional()?;
        if chained.is_some() {
            return Ok(chained);
        }
    }
    if !claims.indexed_keys {
        // No key of the chat was ever indexed.
        return Ok(None);
    }
    db.with(Held::ClaimByIndex, |statement| {
        Ok(statement
            .query_row(params![claims.chat_no, key], found)
            .optional()?)
    })
}

/// A row of `(rowid, status, result)` as a [`Found`].
fn found(row: &rusqlite::Row<'_>) -> rusqlite::Result<Found> {
    Ok(Found {
        row: row.get(0)?,
        status: row.get(1)?,
        result: row.get(2)?,
    })
}

/// What the store holds for a key.
pub(crate) enum Lookup {
    /// No such chat.
    UnknownChat,
    /// Claimed before: the answer a new claim gets.
    Found(ToolClaim),
    /// Never claimed; the chat's heads, for [`insert`].
    Absent(Heads),
}

/// The claim of (chat, key), if any.
pub(crate) fn lookup(db: &Db<'_>, chat_id: &str, key: &str) -> Result<Lookup, StoreError> {
    let Some(claims) = heads(db, chat_id)? else {
        return Ok(Lookup::UnknownChat);
    };
    let Some(existing) = find(db, &claims, key)? else {
        return Ok(Lookup::Absent(claims));
    };
    match existing.status.as_str() {
        "started" => Ok(Lookup::Found(ToolClaim::AlreadyStarted)),
        "completed" => {
            let result = existing
                .result
                .map(|text| json_from_sql(&text, "tool result"))
                .transpose()?;
            Ok(Lookup::Found(ToolClaim::AlreadyCompleted(result)))
        }
        other => Err(StoreError::Corrupt(format!(
            "tool invocation '{key}' has status '{other}'"
        ))),
    }
}

/// Claim (chat, key), or report who has it.
pub(crate) fn claim(db: &Db<'_>, chat_id: &str, key: &str) -> Result<ToolClaim, StoreError> {
    match lookup(db, chat_id, key)? {
        Lookup::UnknownChat => Err(StoreError::NotFound(chat_id.to_owned())),
        Lookup::Found(answer) => Ok(answer),
        Lookup::Absent(claims) => {
            insert(db, chat_id, &claims, key, now_ms())?;
            Ok(ToolClaim::Claimed)
        }
    }
}

/// Writes the 'started' row of a key [`lookup`] found absent (with the chat's `claims`).
pub(crate) fn insert(
    db: &Db<'_>,
    chat_id: &str,
    claims: &Heads,
    key: &str,
    started_at_ms: i64,
) -> Result<(), StoreError> {
    let filter = chain_filter(claims.claims_head, claims.head_filter, key);
    db.with(Held::InsertClaim, |statement| {
        Ok(statement.execute(params![
            claims.chat_no,
            key,
            started_at_ms,
            claims.claims_head,
            filter
        ])?)
    })?;
    let row = db.last_insert_rowid();
    let chained = claims.unindexed_claims + 1;
    let (head, unindexed) = if chained < UNINDEXED_CLAIMS {
        (Some(row), chained)
    } else {
        // The chain is full: index its keys (one leaf of the index, written once for all).
        db.prepare_cached(walk_chain!(
            "INSERT INTO tool_invocation_keys (chat_no, invocation_key, claim_row) \
             SELECT t.chat_no, t.invocation_key, t.rowid FROM walk w \
             JOIN tool_invocations t ON t.rowid = w.r"
        ))?
        .execute([row])
        .map_err(|e| crate::sqlite_error::from_write(e, chat_id, "tool invocation"))?;
        (None, 0)
    };
    db.with(Held::MoveClaimsHead, |statement| {
        Ok(statement.execute(params![head, unindexed, claims.chat_no])?)
    })?;
    db.remember_heads(
        chat_id,
        Heads {
            claims_head: head,
            unindexed_claims: unindexed,
            head_filter: head.and(filter),
            // The old head is the new one's `prev`.
            head_prev: head.and(claims.claims_head),
            indexed_keys: claims.indexed_keys || head.is_none(),
            ..*claims
        },
    );
    Ok(())
}

/// Mark a claimed invocation completed with its result (JSON text).
pub(crate) fn complete(
    db: &Db<'_>,
    chat_id: &str,
    key: &str,
    result: &str,
) -> Result<(), StoreError> {
    // An unknown chat has no claims: "never claimed".
    let Some(claims) = heads(db, chat_id)? else {
        return Err(never_claimed(chat_id, key));
    };
    // Most completions are of the chat's newest claim, or of the one before it when the
    // chat's next turn claimed again before this completion (it is written unhurried): each
    // is completed at once by its row when it is the key's and still started; anything else
    // is looked for.
    let completed_at = now_ms();
    for row in [claims.claims_head, claims.head_prev].into_iter().flatten() {
        let completed = db.with(Held::CompleteRecentClaim, |statement| {
            Ok(statement.execute(params![result, completed_at, row, claims.chat_no, key])?)
        })?;
        if completed == 1 {
            return Ok(());
        }
    }
    let found = find(db, &claims, key)?;
    match found {
        Some(claim) if claim.status == "started" => {
            db.with(Held::CompleteClaim, |statement| {
                Ok(statement.execute(params![result, completed_at, claim.row])?)
            })?;
            Ok(())
        }
        Some(_) => Err(StoreError::Conflict(format!(
            "tool invocation '{key}' of chat '{chat_id}' is already completed"
        ))),
        None => Err(never_claimed(chat_id, key)),
    }
}

fn never_claimed(chat_id: &str, key: &str) -> StoreError {
    StoreError::Conflict(format!(
        "tool invocation '{key}' of chat '{chat_id}' was never claimed"
    ))
}

/// Deletes every claim of the chat (before its number goes, which takes the index entries).
pub(crate) fn delete(db: &Db<'_>, chat_id: &str) -> Result<(), StoreError> {
    let Some(claims) = heads(db, chat_id)? else {
        return Ok(());
    };
    db.prepare_cached(
        "DELETE FROM tool_invocations WHERE rowid IN \
         (SELECT claim_row FROM tool_invocation_keys WHERE chat_no = ?)",
    )?
    .execute([claims.chat_no])?;
    if let Some(head) = claims.claims_head {
        db.prepare_cached(walk_chain!(
            "DELETE FROM tool_invocations WHERE rowid IN (SELECT r FROM walk)"
        ))?
        .execute([head])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::filter_bits;

    #[test]
    fn a_keys_filter_bits_are_two_fixed_bits_of_the_stored_format() {
        // Stored in `tool_invocations.chain_filter`: a change here misreads every stored filter.
        assert_eq!(filter_bits("turn_c1_agent_1:s0:0"), 0x0080_8000_0000_0000);
        assert_eq!(filter_bits(""), 0x4000_0080_0000_0000);
        for key in ["a", "turn_c1_agent_1:s0:0", "turn_c1_agent_1:s1:0"] {
            let ones = filter_bits(key).count_ones();
            assert!(ones == 1 || ones == 2, "{key}: {ones} bits");
        }
    }
}
