//! A contender in a process of its own, for the SQL backend's fault tests:
//! they kill it (SIGKILL) or pause it (SIGSTOP) while it holds.
//!
//! `sql_probe URL NAME ROLE TTL_MS` prints one line per step:
//! - `hold`: takes the lock, prints `held TOKEN`, then holds until killed;
//! - `fenced`: takes the lock, opens a fenced transaction on the same
//!   database, inserts `TOKEN` into the table `probe_writes (token bigint)`,
//!   prints `ready TOKEN`, then on the line `commit` from standard input
//!   commits and prints `committed` or `refused: ERROR`.

use std::io::BufRead;
use std::time::Duration;

use lockline::{Client, SessionOptions};
use lockline_sql::{Engine, FencedTransaction, Sql};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, name, role, ttl] = args.as_slice() else {
        return Err("usage: sql_probe URL NAME hold|fenced TTL_MS".into());
    };
    let ttl = Duration::from_millis(ttl.parse()?);
    let sql = Sql::new(url.clone());
    let engine = sql.engine()?;
    let options = SessionOptions::new()
        .with_ttl(ttl)
        .with_connect_timeout(Duration::from_secs(5))
        .with_request_timeout(Duration::from_secs(2));
    let session = Client::new(sql).session_with(options).await?;
    let guard = session.mutex(name)?.lock().await?;
    let token = i64::try_from(guard.token().get())?;
    match role.as_str() {
        "hold" => {
            println!("held {token}");
            guard.lost().await;
            println!("lost");
            std::future::pending::<()>().await;
        }
        "fenced" => {
            let outcome = match engine {
                Engine::Postgres => {
                    let pool = sqlx::PgPool::connect(url).await?;
                    let mut tx = FencedTransaction::begin_postgres(&guard, &pool).await?;
                    sqlx::query("INSERT INTO probe_writes (token) VALUES ($1)")
                        .bind(token)
                        .execute(&mut *tx)
                        .await?;
                    println!("ready {token}");
                    wait_for_commit()?;
                    tx.commit().await
                }
                _ => {
                    let pool = sqlx::MySqlPool::connect(url).await?;
                    let mut tx = FencedTransaction::begin_mysql(&guard, &pool).await?;
                    sqlx::query("INSERT INTO probe_writes (token) VALUES (?)")
                        .bind(token)
                        .execute(&mut *tx)
                        .await?;
                    println!("ready {token}");
                    wait_for_commit()?;
                    tx.commit().await
                }
            };
            match outcome {
                Ok(()) => println!("committed"),
                Err(error) => println!("refused: {error:?}"),
            }
        }
        other => return Err(format!("unknown role {other:?}").into()),
    }
    Ok(())
}

/// Blocks until standard input says `commit`.
fn wait_for_commit() -> std::io::Result<()> {
    for line in std::io::stdin().lock().lines() {
        if line?.trim() == "commit" {
            return Ok(());
        }
    }
    Err(std::io::Error::other("standard input closed before `commit`"))
}
