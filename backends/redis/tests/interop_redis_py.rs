//! Interop with redis-py's `Lock` (Debian `python3-redis`), the single-key
//! `SET n token NX PX` lock: a lockline mutex holder owns the plain key `n`,
//! so each excludes the other, both ways.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use lockline::conformance::bounded;
use lockline::{Client, SessionOptions};
use lockline_redis::Redis;
use lockline_testkit::{RedisOptions, RedisServer};

/// Debian's interpreter, the one `python3-redis` installs into.
const PYTHON: &str = "/usr/bin/python3";

/// A redis-py process driven line by line: `acquire` (blocking, polling as
/// redis-py does), `try` (non-blocking), `release`; it answers each line.
const DRIVER: &str = r#"
import sys, redis
port, name = int(sys.argv[1]), sys.argv[2]
r = redis.Redis(host="127.0.0.1", port=port)
lock = r.lock(name, timeout=30, sleep=0.05)
print("ready", flush=True)
for line in sys.stdin:
    word = line.strip()
    if word == "acquire":
        print("acquired" if lock.acquire(blocking=True) else "failed", flush=True)
    elif word == "try":
        print("acquired" if lock.acquire(blocking=False) else "busy", flush=True)
    elif word == "release":
        lock.release()
        print("released", flush=True)
"#;

struct PyLock {
    child: Child,
    stdin: ChildStdin,
    answers: tokio::sync::mpsc::UnboundedReceiver<String>,
}

impl PyLock {
    fn start(port: u16, name: &str) -> Self {
        let mut child = Command::new(PYTHON)
            .args(["-c", DRIVER, &port.to_string(), name])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start python3 with redis-py (Debian python3-redis)");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, answers) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        PyLock { child, stdin, answers }
    }

    fn say(&mut self, word: &str) {
        writeln!(self.stdin, "{word}").expect("write to redis-py");
    }

    async fn answer(&mut self) -> String {
        bounded("redis-py answers", self.answers.recv())
            .await
            .expect("redis-py exited")
    }
}

impl Drop for PyLock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn options() -> SessionOptions {
    SessionOptions::new().with_ttl(Duration::from_secs(6))
}

/// redis-py holds: a lockline contender at the head waits until redis-py
/// releases, and is woken by the keyspace event of the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockline_waits_for_a_redis_py_holder() {
    let server = RedisServer::start_with(&RedisOptions {
        keyspace_events: "Kgx".into(),
        ..RedisOptions::default()
    })
    .expect("start redis");
    let mut py = PyLock::start(server.port(), "jobs/py-first");
    assert_eq!(py.answer().await, "ready");
    py.say("acquire");
    assert_eq!(py.answer().await, "acquired");

    let client = Client::new(Redis::new(server.url()));
    let session = client.session_with(options()).await.expect("session");
    let mutex = session.mutex("jobs/py-first").expect("mutex");
    assert!(
        mutex.try_lock().await.expect("try_lock").is_none(),
        "lockline took a lock redis-py holds"
    );
    let waiter = {
        let mutex = mutex.clone();
        tokio::spawn(async move { mutex.lock().await })
    };
    lockline::conformance::wait_for_stats(&client, |s| s.waits >= 1).await;
    assert!(!waiter.is_finished(), "lockline was granted while redis-py held");
    py.say("release");
    assert_eq!(py.answer().await, "released");
    // Woken by the release's keyspace event, long before redis-py's 30 s timeout.
    let guard = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("granted soon after redis-py's release")
        .expect("task")
        .expect("lock");
    // Now redis-py is kept out.
    py.say("try");
    assert_eq!(py.answer().await, "busy");
    guard.release().await.expect("release");
    py.say("try");
    assert_eq!(py.answer().await, "acquired");
    py.say("release");
    assert_eq!(py.answer().await, "released");
}

/// lockline holds: redis-py's blocking acquire waits (polling) until
/// lockline releases, then gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_waits_for_a_lockline_holder() {
    let server = RedisServer::start().expect("start redis");
    let client = Client::new(Redis::new(server.url()));
    let session = client.session_with(options()).await.expect("session");
    let guard = session
        .mutex("jobs/lockline-first")
        .expect("mutex")
        .lock()
        .await
        .expect("lock");
    let mut py = PyLock::start(server.port(), "jobs/lockline-first");
    assert_eq!(py.answer().await, "ready");
    py.say("try");
    assert_eq!(py.answer().await, "busy", "redis-py took a lock lockline holds");
    py.say("acquire");
    // It polls while lockline holds; the answer comes only after the release.
    let early = tokio::time::timeout(Duration::from_millis(300), py.answers.recv()).await;
    assert!(early.is_err(), "redis-py acquired while lockline held: {early:?}");
    // The holder's renewals keep the plain key alive past several renewals.
    assert!(guard.is_held());
    guard.release().await.expect("release");
    assert_eq!(py.answer().await, "acquired");
    // And while redis-py holds, a lockline contender is kept out.
    let mutex = session.mutex("jobs/lockline-first").expect("mutex");
    assert!(mutex.try_lock().await.expect("try_lock").is_none());
    py.say("release");
    assert_eq!(py.answer().await, "released");
    let again = bounded("lockline again", mutex.lock()).await.expect("lock");
    again.release().await.expect("release");
}

/// A server of the test's own, a plain connection to it (another client's
/// commands) and a lockline session on it.
async fn plain_and_lockline() -> (
    RedisServer,
    redis::aio::MultiplexedConnection,
    Client,
    lockline::Session,
) {
    let server = RedisServer::start().expect("start redis");
    let raw = redis::Client::open(server.url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let client = Client::new(Redis::new(server.url()));
    let session = client.session_with(options()).await.expect("session");
    (server, raw, client, session)
}

/// `SET key foreign NX PX 30000`: whether it took the key.
async fn set_nx(raw: &mut redis::aio::MultiplexedConnection, key: &str) -> bool {
    redis::cmd("SET")
        .arg(key)
        .arg("foreign")
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async::<Option<String>>(raw)
        .await
        .expect("SET NX")
        .is_some()
}

/// The other single-key locks by what they do on the server: `SET n token NX
/// PX` (redsync and node-redlock on one node, the usual Lua-release lock)
/// and Redisson's `RLock`, a hash at `n` taken only where `n` does not
/// exist. A lockline holder makes both fail; either of them makes a lockline
/// contender wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_nx_locks_and_redisson_hashes_exclude_lockline_and_back() {
    use redis::AsyncCommands;
    let (_server, mut raw, _client, session) = plain_and_lockline().await;
    let mutex = session.mutex("jobs/single-key").expect("mutex");

    // lockline holds: SET NX fails, and Redisson's test (EXISTS) says taken.
    let guard = mutex.lock().await.expect("lock");
    assert!(
        !set_nx(&mut raw, "jobs/single-key").await,
        "SET NX took a key a lockline holder owns"
    );
    let exists: bool = raw.exists("jobs/single-key").await.expect("EXISTS");
    assert!(exists, "Redisson's RLock would take a key lockline holds");
    guard.release().await.expect("release");

    // A SET NX PX holder: lockline waits until it lets go.
    assert!(set_nx(&mut raw, "jobs/single-key").await);
    assert!(mutex.try_lock().await.expect("try_lock").is_none());
    let _: () = raw.del("jobs/single-key").await.expect("DEL");

    // A Redisson-style hash holder: lockline is kept out as well.
    let _: () = raw.hset("jobs/single-key", "uuid:1", 1).await.expect("HSET");
    let _: () = raw.pexpire("jobs/single-key", 30_000).await.expect("PEXPIRE");
    assert!(mutex.try_lock().await.expect("try_lock").is_none());
    let _: () = raw.del("jobs/single-key").await.expect("DEL");
    let again = mutex.try_lock().await.expect("try_lock").expect("free again");
    again.release().await.expect("release");
}

/// Lock modes keep no plain key: a `SET n token NX PX` lock (what
/// redis-py's `Lock` sends) of a resource's name is taken beside a
/// lock-mode holder, and a lock-mode request is granted beside such a
/// holder. Neither sees the other (docs/interop.md: do not share names).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_nx_locks_and_lock_modes_do_not_see_each_other() {
    use lockline::LockMode::Ex;
    use redis::AsyncCommands;
    let (_server, mut raw, _client, session) = plain_and_lockline().await;
    let resource = session.resource("jobs/modes").expect("resource");
    let guard = resource.lock(Ex).await.expect("EX");
    assert!(set_nx(&mut raw, "jobs/modes").await, "SET NX saw a lock-mode holder");
    guard.release().await.expect("release");
    let beside = resource.try_lock(Ex).await.expect("try_lock");
    assert!(beside.is_some(), "a lock-mode request saw a SET NX holder");
    beside.expect("EX").release().await.expect("release");
    let _: () = raw.del("jobs/modes").await.expect("DEL");
}
