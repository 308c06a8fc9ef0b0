//! A transaction on the application's own database that commits only while
//! a lock is held.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use lockline::{Error, Leadership, MutexGuard, Permit, ReadGuard, Result, Session, WriteGuard};

use crate::error::{has_code, map, Doing};
use crate::layout::parse_entry_key;

/// A held lock, permit or leadership of the SQL backend: what a
/// [`FencedTransaction`] checks at commit.
pub trait Held {
    /// The entry's key (`NAME/ID`).
    fn key(&self) -> &str;
    /// The session that holds it.
    fn session(&self) -> &Session;
}

macro_rules! held {
    ($($guard:ty),*) => {$(
        impl Held for $guard {
            fn key(&self) -> &str {
                <$guard>::key(self)
            }
            fn session(&self) -> &Session {
                <$guard>::session(self)
            }
        }
    )*};
}

held!(MutexGuard, ReadGuard, WriteGuard, Permit, Leadership);

/// The SQLSTATE with which PostgreSQL's fence function (`lockline_fence`)
/// refuses: the lock is not held, and the transaction is aborted.
pub const NOT_HELD_POSTGRES: &str = "LL002";

/// The SQLSTATE with which MariaDB/MySQL's fence procedure
/// (`lockline_fence`) refuses, with error number 1644 (a signal): the lock
/// is not held, and the procedure has rolled the transaction back.
pub const NOT_HELD_MYSQL: &str = "45L02";

/// A transaction on the application's own database (the one lockline's
/// tables are in) that commits only if the lock is still held at commit time.
///
/// [`commit`](Self::commit) calls the database's fence (`lockline_fence`,
/// a function on PostgreSQL and a procedure on MariaDB/MySQL, which any
/// driver can call: see `docs/fenced-writes.md`) in this very transaction,
/// then commits. The fence locks the lock's entry row (`FOR SHARE` /
/// `LOCK IN SHARE MODE`) and checks that the holder's guard is still held.
/// The row lock makes the check and the commit one step for everyone else:
/// a reaper ending a silent holder, or the next holder passing over a dead
/// entry, deletes that row first and so waits for this commit to end. A
/// holder that paused past its TTL finds its guard gone and its commit
/// refused with [`Error::LockLost`]; nothing it wrote in the transaction
/// lands.
///
/// It dereferences to the driver's connection, so it is an executor for
/// `sqlx` queries (`&mut *tx`). Dropped without [`commit`](Self::commit), it
/// rolls back (the driver's `Transaction` does).
///
/// ```no_run
/// use lockline_sql::{lockline::Client, FencedTransaction, Sql};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let url = "postgres://app:secret@127.0.0.1/app";
/// let pool = sqlx::PgPool::connect(url).await?;
/// let session = Client::new(Sql::new(url)).session().await?;
/// let guard = session.mutex("ledger")?.lock().await?;
/// let mut tx = FencedTransaction::begin_postgres(&guard, &pool).await?;
/// sqlx::query("UPDATE ledger SET balance = balance + 1").execute(&mut *tx).await?;
/// tx.commit().await?; // Err(LockLost) and rolled back if the lock was lost
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct FencedTransaction<'c, DB: sqlx::Database> {
    tx: sqlx::Transaction<'c, DB>,
    key: String,
    /// The call of the fence, with the key as its one parameter.
    fence: Arc<str>,
    target: String,
    backend: &'static str,
}

impl<'c, DB: sqlx::Database> Deref for FencedTransaction<'c, DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &Self::Target {
        &self.tx
    }
}

impl<'c, DB: sqlx::Database> DerefMut for FencedTransaction<'c, DB> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.tx
    }
}

/// The key of a held entry, checked to be one of this backend's.
fn key_of(held: &impl Held) -> Result<String> {
    let key = held.key().to_owned();
    if parse_entry_key(&key).is_none() {
        return Err(Error::InvalidName {
            name: key,
            reason: "not an entry of the SQL backend (NAME/ID)".into(),
        });
    }
    Ok(key)
}

fn not_sql(what: &str) -> Error {
    Error::InvalidOptions {
        reason: format!("a fenced transaction on {what} needs a lock taken through lockline-sql on that engine"),
    }
}

fn begin_failed(backend: &'static str, error: sqlx::Error) -> Error {
    map(
        Doing {
            backend,
            what: "begin a fenced transaction",
            target: "the application's database",
        },
        error,
    )
}

impl<'c, DB: sqlx::Database> FencedTransaction<'c, DB> {
    /// Rolls back.
    ///
    /// # Cancel safety
    ///
    /// If cancelled, the driver rolls back when the connection is next used.
    ///
    /// # Errors
    ///
    /// The driver's error, as [`Error::Backend`] or [`Error::Unavailable`].
    pub async fn rollback(self) -> Result<()> {
        let backend = self.backend;
        self.tx.rollback().await.map_err(|e| {
            map(
                Doing {
                    backend,
                    what: "roll back a fenced transaction",
                    target: &self.target,
                },
                e,
            )
        })
    }

    /// The key of the lock entry the transaction is fenced on: what the
    /// fence is called with.
    pub fn key(&self) -> &str {
        &self.key
    }
}

/// Calls the fence in the transaction, then commits: the one commit of both
/// engines; `$not_held` is the engine's SQLSTATE of a refusal.
macro_rules! fence_and_commit {
    ($transaction:expr, $not_held:expr) => {{
        let FencedTransaction {
            mut tx,
            key,
            fence,
            target,
            backend,
        } = $transaction;
        let doing = |what| Doing {
            backend,
            what,
            target: &target,
        };
        let fenced = sqlx::query(sqlx::AssertSqlSafe(fence))
            .bind(key.as_str())
            .execute(&mut *tx)
            .await;
        match fenced {
            Ok(_) => tx
                .commit()
                .await
                .map_err(|e| map(doing("commit a fenced transaction"), e)),
            Err(error) if has_code(&error, $not_held) => {
                // Aborted (PostgreSQL) or rolled back by the fence
                // (MariaDB/MySQL) already: this ends it on the client too.
                let _ = tx.rollback().await;
                Err(Error::LockLost { key })
            }
            Err(error) => Err(map(doing("check the lock before committing"), error)),
        }
    }};
}

#[cfg(feature = "postgres")]
impl<'c> FencedTransaction<'c, sqlx::Postgres> {
    /// Begins a transaction on `conn` (a pool, a connection) fenced on
    /// `held`, a lock taken through lockline-sql on PostgreSQL in the same
    /// database.
    ///
    /// # Cancel safety
    ///
    /// If cancelled, no transaction is left open (the driver rolls back).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] when `held` was not taken through
    /// lockline-sql on PostgreSQL; the driver's error when the transaction
    /// cannot begin.
    pub async fn begin_postgres(
        held: &impl Held,
        conn: impl sqlx::Acquire<'c, Database = sqlx::Postgres>,
    ) -> Result<Self> {
        let key = key_of(held)?;
        let remote = held.session().backend_session();
        let any: &dyn std::any::Any = remote.as_ref();
        let sql = any
            .downcast_ref::<crate::session::SqlSession<crate::pg::Postgres>>()
            .ok_or_else(|| not_sql("PostgreSQL"))?;
        let fence = sql.dialect().fence_sql().map_err(|e| begin_failed("postgres", e))?;
        let target = sql.target().to_owned();
        let tx = conn.begin().await.map_err(|e| begin_failed("postgres", e))?;
        Ok(FencedTransaction {
            tx,
            key,
            fence,
            target,
            backend: "postgres",
        })
    }

    /// Calls the fence function in the transaction (`SELECT
    /// lockline_fence(KEY)`: it locks the entry row until the commit and
    /// checks that the lock is still held), and commits.
    ///
    /// # Cancel safety
    ///
    /// If cancelled, the transaction may or may not have committed: it
    /// committed only if the lock was held.
    ///
    /// # Errors
    ///
    /// [`Error::LockLost`] (rolled back) when the lock is no longer held
    /// (the fence answered [`NOT_HELD_POSTGRES`]); the driver's error
    /// otherwise.
    pub async fn commit(self) -> Result<()> {
        fence_and_commit!(self, NOT_HELD_POSTGRES)
    }
}

#[cfg(feature = "mysql")]
impl<'c> FencedTransaction<'c, sqlx::MySql> {
    /// Begins a transaction on `conn` (a pool, a connection) fenced on
    /// `held`, a lock taken through lockline-sql on MariaDB/MySQL in the same
    /// database.
    ///
    /// # Cancel safety
    ///
    /// If cancelled, no transaction is left open (the driver rolls back).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] when `held` was not taken through
    /// lockline-sql on MariaDB/MySQL; the driver's error when the
    /// transaction cannot begin.
    pub async fn begin_mysql(held: &impl Held, conn: impl sqlx::Acquire<'c, Database = sqlx::MySql>) -> Result<Self> {
        let key = key_of(held)?;
        let remote = held.session().backend_session();
        let any: &dyn std::any::Any = remote.as_ref();
        let sql = any
            .downcast_ref::<crate::session::SqlSession<crate::my::MySql>>()
            .ok_or_else(|| not_sql("MariaDB/MySQL"))?;
        let fence = sql.dialect().fence_sql().map_err(|e| begin_failed("mysql", e))?;
        let target = sql.target().to_owned();
        let tx = conn.begin().await.map_err(|e| begin_failed("mysql", e))?;
        Ok(FencedTransaction {
            tx,
            key,
            fence,
            target,
            backend: "mysql",
        })
    }

    /// Calls the fence procedure in the transaction (`CALL
    /// lockline_fence(KEY)`: it locks the entry row until the commit and
    /// checks that the lock is still held), and commits.
    ///
    /// # Cancel safety
    ///
    /// If cancelled, the transaction may or may not have committed: it
    /// committed only if the lock was held.
    ///
    /// # Errors
    ///
    /// [`Error::LockLost`] (rolled back) when the lock is no longer held
    /// (the fence answered [`NOT_HELD_MYSQL`]); the driver's error
    /// otherwise.
    pub async fn commit(self) -> Result<()> {
        fence_and_commit!(self, NOT_HELD_MYSQL)
    }
}
