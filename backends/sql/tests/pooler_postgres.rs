//! lockline-sql behind a real PgBouncer in front of a real PostgreSQL.
//! lockline's locks belong to a connection (session-level advisory
//! locks); a transaction-pooling proxy lends one server backend to several
//! client connections, so a lock taken through one is held by all of them.
//! Such a pool must be refused, whatever step finds it, and never grant one
//! lock twice; a session-mode pool gives each client connection a backend of
//! its own and must work.
//!
//! The defences under test: PgBouncer refusing the startup parameters
//! lockline sends (`InvalidOptions` naming a pooler), lockline's functions
//! raising SQLSTATE `LL001` when two of its connections turn out to be one
//! backend, and the heartbeat's `pid = pg_backend_pid()` check.
//!
//! sqlx also sends `extra_float_digits` in its startup packet unless told
//! not to, and PgBouncer does not track that one either. The two-holder case
//! therefore also runs with both ignored, so that the connections are
//! accepted whatever lockline sends and the defences behind the door are
//! reached.

use std::time::{Duration, Instant};

use lockline::conformance::{bounded, spawn_queued, until};
use lockline::{Client, Error, Session, SessionOptions, SessionState};
use lockline_sql::Sql;
use lockline_testkit::{PgBouncer, PgBouncerOptions, PgServer, PoolMode};

mod support;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a contender behind a transaction pool may take to be refused:
/// an open and a lock, each a few statements bounded by the timeouts.
const REFUSAL_BOUND: Duration = Duration::from_secs(10);

fn options() -> SessionOptions {
    SessionOptions::new()
        .with_ttl(Duration::from_secs(5))
        .with_connect_timeout(CONNECT_TIMEOUT)
        .with_request_timeout(REQUEST_TIMEOUT)
}

/// A PostgreSQL server and a PgBouncer in front of it; with `tables`,
/// lockline's tables are made first over a direct connection (as in a
/// deployment that used lockline before the pooler came).
async fn servers(pool_mode: PoolMode, default_pool_size: u32, ignore: &[&str], tables: bool) -> (PgServer, PgBouncer) {
    let server = support::postgres();
    if tables {
        let direct = bounded(
            "open a session directly",
            Client::new(Sql::new(server.url())).session_with(options()),
        )
        .await
        .expect("open a session directly");
        direct.close().await.expect("close the direct session");
    }
    let bouncer = PgBouncer::start(
        &server,
        &PgBouncerOptions {
            pool_mode,
            default_pool_size,
            ignore_startup_parameters: ignore.iter().map(|p| (*p).to_owned()).collect(),
        },
    )
    .expect("start pgbouncer");
    (server, bouncer)
}

async fn open(client: &Client) -> lockline::Result<Session> {
    bounded("open a session through PgBouncer", client.session_with(options())).await
}

/// Whether `error` is the refusal of a pooler: `InvalidOptions` whose reason
/// names a connection pooler or a transaction-pooling proxy.
fn names_the_pooler(error: &Error) -> bool {
    match error {
        Error::InvalidOptions { reason } => {
            let reason = reason.to_ascii_lowercase();
            reason.contains("pooler") || reason.contains("pooling proxy")
        }
        _ => false,
    }
}

/// The password of a `postgres://user:password@host/db` URL.
fn password_of(url: &str) -> &str {
    let credentials = url.split_once("://").map_or("", |(_, rest)| rest);
    let credentials = credentials.rsplit_once('@').map_or("", |(c, _)| c);
    credentials.split_once(':').map_or("", |(_, p)| p)
}

/// (a) With PgBouncer's default startup-parameter policy, a transaction pool
/// refuses the connection; lockline says so as `InvalidOptions` naming the
/// pooler, within the connect timeout, without the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_pool_refusing_the_startup_parameters_is_named_as_a_pooler() {
    let (_server, bouncer) = servers(PoolMode::Transaction, 20, &[], false).await;
    let client = Client::new(Sql::new(bouncer.url()));
    let started = Instant::now();
    let opened = open(&client).await;
    let took = started.elapsed();
    match opened {
        Err(error) if names_the_pooler(&error) => {
            let text = error.to_string();
            eprintln!("defence 1 (startup parameters refused): {text}");
            assert!(
                !text.contains(password_of(&bouncer.url())),
                "the password leaked into {text:?}"
            );
        }
        other => panic!(
            "opening a session through a transaction pool must fail with InvalidOptions naming the pooler, got {:?}",
            other.map(|s| s.id().to_owned())
        ),
    }
    assert!(
        took < CONNECT_TIMEOUT,
        "refused after {took:?}, not within the connect timeout {CONNECT_TIMEOUT:?}"
    );
    let log = bouncer.log_tail(8000);
    assert!(
        log.contains("unsupported startup parameter"),
        "PgBouncer did not log the refusal:\n{log}"
    );
}

/// What the defences said in one run of the two-holder case.
#[derive(Debug, Default)]
struct Seen {
    /// Errors naming the pooler, with the step that got them.
    pooler: Vec<String>,
    /// Every other error, with its step.
    other: Vec<String>,
}

impl Seen {
    fn record(&mut self, step: &str, error: &Error) {
        let line = format!("{step}: {error}");
        if names_the_pooler(error) {
            self.pooler.push(line);
        } else {
            self.other.push(line);
        }
    }
}

/// (b) Every client connection shares one backend (`default_pool_size = 1`),
/// and PgBouncer lets lockline's connections in. Two sessions contend for one
/// mutex: whichever defence fires, session B must never be granted the lock
/// while A holds it, B's `lock()` (or its open) must fail within a bound, and
/// at least one failure must name the pooler.
async fn two_sessions_on_one_backend(ignore: &[&str]) {
    let (server, bouncer) = servers(PoolMode::Transaction, 1, ignore, true).await;
    let client = Client::new(Sql::new(bouncer.url()));
    let mut seen = Seen::default();
    let a = open(&client).await;
    if let Err(error) = &a {
        seen.record("open session A", error);
    }
    let b = open(&client).await;
    if let Err(error) = &b {
        seen.record("open session B", error);
    }
    if let (Ok(a), Ok(b)) = (&a, &b) {
        let name = "pooled/one-backend";
        match bounded("A locks", a.mutex(name).expect("mutex").lock()).await {
            Err(error) => seen.record("A's lock()", &error),
            Ok(held_by_a) => {
                let b_lock = tokio::time::timeout(REFUSAL_BOUND, b.mutex(name).expect("mutex").lock()).await;
                match b_lock {
                    Ok(Ok(held_by_b)) => panic!(
                        "B was granted {name} (token {}, session {:?}) while A {} it (token {}, session {:?}): \
                         two holders behind a transaction pool; no defence fired (nearest's LL001 check \
                         should have refused B's append); errors seen: {seen:?}; PgBouncer log:\n{}",
                        held_by_b.token(),
                        b.state(),
                        if held_by_a.is_held() {
                            "still held"
                        } else {
                            "had been told it lost"
                        },
                        held_by_a.token(),
                        a.state(),
                        bouncer.log_tail(4000),
                    ),
                    Ok(Err(error)) => seen.record("B's lock() while A holds", &error),
                    Err(_) => panic!(
                        "B's lock() neither failed nor was granted within {REFUSAL_BOUND:?} while A holds: \
                         behind a transaction pool it must be refused; errors seen: {seen:?}"
                    ),
                }
                if a.state() == SessionState::Lost || b.state() == SessionState::Lost {
                    seen.other
                        .push(format!("sessions declared lost: A {:?}, B {:?}", a.state(), b.state()));
                }
                drop(held_by_a);
            }
        }
    }
    eprintln!("ignore_startup_parameters = {ignore:?}: {seen:#?}");
    assert!(
        !seen.pooler.is_empty(),
        "no defence named the pooler: {seen:#?}; server backends {:?}; PgBouncer log:\n{}",
        server.backend_pids(),
        bouncer.log_tail(4000),
    );
}

/// (b), with `ignore_startup_parameters = options`: the configuration
/// lockline's own refusal recommends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_sharing_one_backend_never_hold_at_once() {
    two_sessions_on_one_backend(&["options"]).await;
}

/// (b), with every startup parameter sqlx sends ignored: the connections
/// are accepted, and what refuses the pool is behind the door.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_sharing_one_backend_never_hold_at_once_when_every_parameter_is_ignored() {
    two_sessions_on_one_backend(&["options", "extra_float_digits"]).await;
}

/// (c) A session-mode pool (`ignore_startup_parameters = options`, the
/// configuration lockline's refusal recommends) serves lockline: the tables
/// are made through it, a second session queues on the server and is granted
/// after the release, and tokens increase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_pool_serves_lockline() {
    let (server, bouncer) = servers(PoolMode::Session, 20, &["options"], false).await;
    let client = Client::new(Sql::new(bouncer.url()));
    let a = open(&client).await.expect("open session A through a session pool");
    let b = open(&client).await.expect("open session B through a session pool");
    let name = "pooled/session-mode";

    let first = bounded("A locks", a.mutex(name).expect("mutex").lock())
        .await
        .expect("A locks");
    let b_mutex = b.mutex(name).expect("mutex");
    let waiter = spawn_queued(&client, async move { b_mutex.lock().await }).await;
    until("B waits on the server for A's guard", || {
        server.advisory_locks().is_ok_and(|locks| locks.waiting == 1)
    })
    .await;
    assert!(!waiter.is_finished(), "B was granted while A holds");
    let taken = bounded("a third try_lock", a.mutex(name).expect("mutex").try_lock())
        .await
        .expect("try_lock");
    assert!(taken.is_none(), "try_lock got the lock while A holds it");

    let first_token = first.token();
    bounded("A releases", first.release()).await.expect("A releases");
    let second = bounded("B is granted after A's release", waiter)
        .await
        .expect("waiter task")
        .expect("B is granted after A's release");
    assert!(
        second.token() > first_token,
        "token {} not above {first_token}",
        second.token()
    );
    let second_token = second.token();
    bounded("B releases", second.release()).await.expect("B releases");
    let third = bounded("A locks again", a.mutex(name).expect("mutex").lock())
        .await
        .expect("A locks again");
    assert!(
        third.token() > second_token,
        "token {} not above {second_token}",
        third.token()
    );
    assert_eq!(a.state(), SessionState::Live);
    assert_eq!(b.state(), SessionState::Live);
    bounded("A releases", third.release()).await.expect("A releases");
    bounded("close A", a.close()).await.expect("close A");
    bounded("close B", b.close()).await.expect("close B");
    let log = bouncer.log_tail(8000);
    assert!(
        !log.contains("unsupported startup parameter"),
        "PgBouncer refused a parameter:\n{log}"
    );
}
