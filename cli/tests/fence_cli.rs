//! The database's fence from a shell job under `lockline lock`, with the
//! engines' own clients: `psql` runs `BEGIN; INSERT …; SELECT
//! lockline_fence('$LOCKLINE_KEY'); COMMIT` on PostgreSQL, `mariadb` the
//! same with `CALL lockline_fence(…)` on MariaDB. While the lock is held the
//! job commits; when the holder (`lockline` itself) is paused (SIGSTOP) past
//! its TTL and the lock is granted to the next holder, the job's commit is
//! refused with the documented SQLSTATE (LL002, 45L02) and nothing it wrote
//! lands.

mod support;

use std::process::Stdio;
use std::time::Duration;

use lockline::conformance::bounded;
use lockline::{Client, SessionOptions};
use lockline_sql::Sql;
use support::{lockline, Running};

/// The job: writes its token in an open transaction, says `ready` (through
/// the client, once the insert ran), waits for a line on its standard
/// input, then calls the fence and commits. `$FENCE_CLIENT` is the client's
/// command line, `$FENCE_CALL` `SELECT` or `CALL`, `$FENCE_READY` the
/// client's statement that prints `ready`.
const JOB: &str = r#"{
  echo "BEGIN; INSERT INTO fenced_writes (token) VALUES ($LOCKLINE_TOKEN);"
  printf '%s\n' "$FENCE_READY"
  read go
  echo "$FENCE_CALL lockline_fence('$LOCKLINE_KEY'); COMMIT;"
} | $FENCE_CLIENT"#;

struct Engine {
    /// `--postgres URL` or `--mysql URL`.
    server: Vec<String>,
    client: String,
    call: &'static str,
    ready: &'static str,
    /// What the client prints of a refusal.
    refused: &'static str,
    url: String,
}

fn postgres(server: &lockline_testkit::PgServer, args: Vec<String>) -> Engine {
    server
        .psql("CREATE TABLE fenced_writes (token bigint NOT NULL)")
        .expect("create the table");
    Engine {
        client: format!(
            "{} -X -q -v ON_ERROR_STOP=1 -v VERBOSITY=verbose {}",
            server.bin_dir().join("psql").display(),
            server.url()
        ),
        call: "SELECT",
        ready: r"\echo ready",
        refused: "ERROR:  LL002: lockline: the lock",
        url: server.url(),
        server: args,
    }
}

fn mariadb(server: &lockline_testkit::MariaDbServer, args: Vec<String>) -> Engine {
    server
        .sql("CREATE TABLE cli.fenced_writes (token BIGINT NOT NULL) ENGINE=InnoDB")
        .expect("create the table");
    let url = args[1].clone();
    let (credentials, place) = url
        .strip_prefix("mysql://")
        .and_then(|rest| rest.rsplit_once('@'))
        .expect("a URL with credentials");
    let (user, password) = credentials.split_once(':').expect("user:password");
    let (address, database) = place.split_once('/').expect("a database");
    let (host, port) = address.split_once(':').expect("host:port");
    assert!(!password.contains('%'), "a password the client takes as it is");
    Engine {
        client: format!(
            "/usr/bin/mariadb --no-defaults --batch --skip-column-names --unbuffered -h {host} -P {port} -u {user} -p{password} {database}"
        ),
        call: "CALL",
        ready: "SELECT 'ready';",
        refused: "ERROR 1644 (45L02) at line 3: lockline: the lock",
        url,
        server: args,
    }
}

fn options() -> SessionOptions {
    SessionOptions::new().with_ttl(Duration::from_secs(2))
}

/// `lockline lock --ttl TTL NAME sh -c JOB`, once the job said `ready`.
fn start_job(engine: &Engine, name: &str, ttl: &str) -> (Running, String, u64) {
    let mut command = lockline("lock", &engine.server);
    command
        .args(["--ttl", ttl, name, "sh", "-c", JOB])
        .env("FENCE_CLIENT", &engine.client)
        .env("FENCE_CALL", engine.call)
        .env("FENCE_READY", engine.ready)
        .stdin(Stdio::piped());
    let job = Running::spawn(name, command);
    let (key, token) = job.holding();
    assert_eq!(job.stdout_line(), "ready", "the job wrote in its transaction");
    (job, key, token)
}

/// A live holder's job commits; the job of a holder paused past its TTL and
/// replaced is refused, and nothing of it lands. `writes` counts the rows of
/// a token.
async fn the_job_commits_only_while_the_lock_is_held(engine: Engine, writes: impl Fn(u64) -> i64) {
    // Held: the job commits, and lockline exits with its status.
    let (mut job, _, token) = start_job(&engine, "fence/live", "10");
    job.send_line("go");
    assert!(job.exits().success(), "the job's commit");
    assert_eq!(writes(token), 1);

    // Paused past its TTL (the job waiting, its transaction open) and
    // replaced: refused.
    let (mut job, key, stale) = start_job(&engine, "fence/paused", "2");
    job.signal(libc::SIGSTOP);
    let session = Client::new(Sql::new(engine.url.clone()))
        .session_with(options())
        .await
        .expect("session");
    let next = bounded(
        "the next holder is granted",
        session.mutex("fence/paused").expect("mutex").lock(),
    )
    .await
    .expect("lock");
    assert!(next.token().get() > stale);
    job.send_line("go");
    let refused = job.stderr_line_with("lockline: the lock");
    assert!(
        refused.contains(engine.refused) && refused.contains(&format!("'{key}' is not held")),
        "the job's commit must be refused with {:?}, its client said {refused:?}",
        engine.refused
    );
    job.signal(libc::SIGCONT);
    job.exits();
    assert_eq!(writes(stale), 0, "the paused holder's job's write landed");
    next.release().await.expect("release");
}

fn count(out: String) -> i64 {
    out.trim()
        .parse()
        .unwrap_or_else(|e| panic!("a count, not {out:?}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psql_under_lockline_lock() {
    let (server, args) = support::postgres();
    let engine = postgres(&server, args);
    the_job_commits_only_while_the_lock_is_held(engine, |token| {
        count(
            server
                .psql(&format!("SELECT count(*) FROM fenced_writes WHERE token = {token}"))
                .expect("count"),
        )
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_under_lockline_lock() {
    let (server, args) = support::mariadb();
    let engine = mariadb(&server, args);
    the_job_commits_only_while_the_lock_is_held(engine, |token| {
        count(
            server
                .sql(&format!("SELECT count(*) FROM cli.fenced_writes WHERE token = {token}"))
                .expect("count"),
        )
    })
    .await;
}
