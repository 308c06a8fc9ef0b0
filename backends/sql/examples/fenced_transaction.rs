//! A transaction on your own tables that commits only while the lock is held.
//!
//! Two workers record a nightly payout under the lock `payouts/nightly`. The
//! first one's hold on the lock ends while its transaction is still open
//! (here its lock connection is cut, as a network fault or a reaper ending a
//! silent holder would); the second is granted the lock and commits its
//! payout. When the first one then tries to commit, the commit is refused
//! with `LockLost` and nothing it wrote lands: the lock check and the commit
//! are one step. One payout is recorded, not two.
//!
//! (Both only insert. Rows the stale transaction updated would stay locked
//! by it until it ends, and the next holder's updates of them would wait
//! for that: keep fenced transactions short, and bound them with
//! `idle_in_transaction_session_timeout` on the application's pool.)
//!
//! ```text
//! cargo run -p lockline-sql --example fenced_transaction              # a throwaway PostgreSQL
//! DATABASE_URL=postgres://app:secret@db/app cargo run -p lockline-sql --example fenced_transaction
//! ```

use std::time::Duration;

use lockline::{Client, Error, SessionOptions};
use lockline_sql::{FencedTransaction, Sql};
use lockline_testkit::{PgOptions, PgServer};

async fn run(url: &str) -> Result<(), Box<dyn std::error::Error>> {
    let pool = sqlx::PgPool::connect(url).await?;
    sqlx::raw_sql(
        "DROP TABLE IF EXISTS payouts; \
         CREATE TABLE payouts (night date NOT NULL, token bigint NOT NULL, amount bigint NOT NULL);",
    )
    .execute(&pool)
    .await?;
    let options = SessionOptions::new().with_ttl(Duration::from_secs(5));
    let client = Client::new(Sql::new(url));
    let (first, second) = (
        client.session_with(options.clone()).await?,
        client.session_with(options).await?,
    );
    let record = "INSERT INTO payouts VALUES (current_date, $1, $2)";

    // The first worker takes the lock and starts recording the payout.
    let stale = first.mutex("payouts/nightly")?.lock().await?;
    let mut tx = FencedTransaction::begin_postgres(&stale, &pool).await?;
    sqlx::query(record)
        .bind(i64::try_from(stale.token().get())?)
        .bind(100_i64)
        .execute(&mut *tx)
        .await?;

    // Its lock connection is cut before it commits; the second worker,
    // queued meanwhile, is granted the lock and records the payout.
    let waiting = second.mutex("payouts/nightly")?;
    let takeover = tokio::spawn(async move { waiting.lock().await });
    sqlx::query("SELECT pg_terminate_backend(pid) FROM lockline_sessions WHERE id = $1")
        .bind(first.id())
        .execute(&pool)
        .await?;
    let newer = takeover.await??;
    println!(
        "the second worker holds the lock, token {} > {}",
        newer.token(),
        stale.token()
    );
    let mut fresh = FencedTransaction::begin_postgres(&newer, &pool).await?;
    sqlx::query(record)
        .bind(i64::try_from(newer.token().get())?)
        .bind(100_i64)
        .execute(&mut *fresh)
        .await?;
    fresh.commit().await?;

    // The first worker carries on and commits: refused, and rolled back.
    let late = tx.commit().await;
    println!("the first worker's commit: {late:?}");
    assert!(matches!(late, Err(Error::LockLost { .. })));
    let tokens: Vec<i64> = sqlx::query_scalar("SELECT token FROM payouts").fetch_all(&pool).await?;
    println!("payouts recorded by tokens {tokens:?}");
    assert_eq!(tokens, [i64::try_from(newer.token().get())?]);
    newer.release().await?;
    second.close().await?;
    Ok(())
}

/// The database to use: `DATABASE_URL`, or a throwaway PostgreSQL.
fn database() -> Result<(String, Option<PgServer>), Box<dyn std::error::Error>> {
    if let Ok(url) = std::env::var("DATABASE_URL") {
        return Ok((url, None));
    }
    let server = PgServer::start_with(&PgOptions {
        durable: false,
        ..PgOptions::default()
    })?;
    Ok((server.url(), Some(server)))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = database()?;
    run(&url).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_holder_commits_nothing() {
    let server = PgServer::start_with(&PgOptions {
        durable: false,
        ..PgOptions::default()
    })
    .expect("start postgres");
    run(&server.url()).await.expect("the example runs");
}
