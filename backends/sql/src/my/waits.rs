//! Waits on the server: on an entry's guard (reading the waiter's turn in
//! the same call of the wait procedure), on an election value's version,
//! and the look at waits that have no connection of their own.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use sqlx::mysql::MySqlConnection;
use sqlx::{AssertSqlSafe, Row as _};

use super::entries::parse_nearest;
use super::MySql;
use crate::dialect::{shape, Beat, DbResult, EntryStatus, Liveness, Status, Turn, TurnRead, Waited, Waits};

/// What a wait says when the lock it would wait for is held by its own
/// connection: two of lockline's connections are one server connection.
const MULTIPLEXED: &str = "two connections of lockline share one server connection: a multiplexing proxy (ProxySQL, \
     MaxScale) is in front of the database; the locks of lockline belong to a connection, so it needs a direct \
     connection";

impl MySql {
    /// Whether entry `id`'s row is there, read by a statement of its own.
    async fn row_exists(&self, conn: &mut MySqlConnection, id: i64) -> DbResult<bool> {
        let count: i64 = sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.names()?.sql.exists)))
            .bind(id)
            .fetch_one(conn)
            .await?;
        Ok(count > 0)
    }

    /// Waits on the guard of entry `entry` (see the wait procedure in the
    /// DDL), and reads `turn` after it unless the bound ran out: one round
    /// trip.
    async fn wait_on(
        &self,
        conn: &mut MySqlConnection,
        entry: i64,
        owner: &str,
        bound_ms: i64,
        turn: Option<&Turn>,
    ) -> DbResult<(Waited, Option<TurnRead>)> {
        let names = self.names()?;
        let found = sqlx::query(AssertSqlSafe(Arc::clone(&names.sql.wait)))
            .bind(entry)
            .bind(owner)
            .bind(bound_ms)
            .bind(turn.map(|t| t.id))
            .bind(turn.map(|t| t.name.as_bytes()))
            .bind(turn.map(|t| t.session.as_str()))
            .bind(turn.is_some_and(|t| t.skip_shared))
            .bind(turn.map_or(0, |t| t.count))
            .fetch_all(&mut *conn)
            .await?;
        let [row] = found.as_slice() else {
            return Err(shape(format!("the wait answered {} rows, not one", found.len())));
        };
        let code: Option<i64> = row.try_get(0)?;
        let waited = match code {
            Some(0) => Waited::Released,
            // Its row outlived its guard (read by a statement after the
            // wait: a release deletes the row, then lets go of the guard).
            Some(3) => Waited::Lost,
            Some(1) => Waited::TimedOut(Beat::of(row.try_get(1)?, row.try_get(2)?)),
            // This connection holds the lock it would wait for: two of
            // lockline's connections are one server connection (a
            // multiplexing proxy in front of the server).
            Some(4) => return Err(sqlx::Error::Configuration(MULTIPLEXED.into())),
            // GET_LOCK ended by KILL QUERY answers NULL: this session's
            // cancel, or a writer's wake meant for a watch on this connection.
            None => Waited::Interrupted,
            Some(other) => return Err(shape(format!("wait returned {other}"))),
        };
        let read: i64 = row.try_get(3)?;
        if turn.is_none() || read == 0 || !matches!(waited, Waited::Released | Waited::Lost) {
            return Ok((waited, None));
        }
        let mine: i64 = row.try_get(4)?;
        if mine == 0 {
            return Ok((waited, Some(None)));
        }
        let nearest: String = row.try_get(5)?;
        Ok((waited, Some(Some(parse_nearest(&nearest)?))))
    }
}

#[async_trait]
impl Waits for MySql {
    async fn statuses(&self, conn: &mut MySqlConnection, ids: &[(i64, i64)]) -> DbResult<Vec<EntryStatus>> {
        let names = self.names()?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let list = ids.iter().map(|(id, _)| id.to_string()).collect::<Vec<_>>().join(",");
        let found = sqlx::query(AssertSqlSafe(format!(
            "SELECT e.id, e.version, CASE WHEN IS_FREE_LOCK(CONCAT('{p}e:', e.attempt)) THEN 0 ELSE 1 END, \
             e.session, s.beat, s.ttl_ms \
             FROM {entries} e LEFT JOIN {sessions} s ON s.id = e.session WHERE e.id IN ({list})",
            p = names.lock_prefix,
            entries = names.entries,
            sessions = names.sessions,
        )))
        .fetch_all(&mut *conn)
        .await?;
        let mut rows = HashMap::new();
        for row in found {
            let (id, version, code, owner): (i64, i64, i64, String) =
                (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?, row.try_get(3)?);
            let beat = Beat::of(row.try_get(4)?, row.try_get(5)?);
            rows.insert(id, (version, code, owner, beat));
        }
        // A row read with a free guard may have been read from a snapshot
        // older than a release (which deletes the row, then frees the
        // guard): only a row a fresh statement still finds outlived its
        // guard; the others were released.
        for (id, (_, code, ..)) in rows.iter_mut() {
            if *code == 0 && !self.row_exists(conn, *id).await? {
                *code = -1;
            }
        }
        rows.retain(|_, (_, code, ..)| *code != -1);
        Ok(ids
            .iter()
            .map(|&(id, wanted)| match rows.get(&id) {
                None => (id, wanted, Status::Free, String::new(), None),
                Some((version, code, owner, beat)) => {
                    let status = if wanted >= 0 && *version != wanted {
                        Status::Free
                    } else if *code == 0 {
                        // The row is there and its guard free: its owner's
                        // connection ended.
                        Status::Dead
                    } else {
                        Status::Held
                    };
                    (id, wanted, status, owner.clone(), *beat)
                }
            })
            .collect())
    }

    async fn wait(&self, conn: &mut MySqlConnection, id: i64, owner: &str, bound_ms: i64) -> DbResult<Waited> {
        Ok(self.wait_on(conn, id, owner, bound_ms, None).await?.0)
    }

    async fn wait_turn(
        &self,
        conn: &mut MySqlConnection,
        id: i64,
        owner: &str,
        bound_ms: i64,
        turn: &Turn,
    ) -> DbResult<(Waited, Option<TurnRead>)> {
        self.wait_on(conn, id, owner, bound_ms, Some(turn)).await
    }

    async fn wait_version(
        &self,
        conn: &mut MySqlConnection,
        id: i64,
        version: i64,
        owner: &str,
        bound_ms: i64,
    ) -> DbResult<Waited> {
        let names = self.names()?;
        let lock = names.version_lock(id, version);
        let code: Option<i64> = sqlx::query_scalar(AssertSqlSafe(Arc::clone(&names.sql.wait_lock)))
            .bind(&lock)
            .bind(&lock)
            .bind(&lock)
            .bind(bound_ms)
            .bind(owner)
            .bind(bound_ms)
            .fetch_one(&mut *conn)
            .await?;
        match code {
            Some(0) => Ok(Waited::Released),
            // The owner's heartbeat now, by a statement of its own (a fresh
            // snapshot, read after the wait).
            Some(1) => Ok(Waited::TimedOut(self.beat_of(conn, owner).await?)),
            Some(4) => Err(sqlx::Error::Configuration(MULTIPLEXED.into())),
            // GET_LOCK ended by KILL QUERY answers NULL: this session's
            // cancel, or a writer's wake meant for a watch on this connection.
            None => Ok(Waited::Interrupted),
            Some(other) => Err(shape(format!("wait returned {other}"))),
        }
    }
}
