//! `lockline lock --lock-delay SECS` and `lockline elect --lock-delay SECS`,
//! process against process: a waiter behind a `lockline` holder killed with
//! SIGKILL is granted no sooner than the delay after the kill, and `lockline
//! list` shows it `lock-delay until TIME` meanwhile; behind a holder whose
//! command exits (a release) it is granted at once (but for a ZooKeeper
//! election, as the ZooKeeper backend documents). On every server backend:
//! on etcd, ZooKeeper and Redis the killed holder's entry goes when its
//! session's TTL (2 s here) runs out, and the delay counts from then.

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use support::{eventually, lockline, Running, BOUND};

const DELAY: Duration = Duration::from_millis(1500);

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The `list` lines of `name`, split on tabs.
fn list(server: &[String], name: &str) -> Vec<Vec<String>> {
    let out = lockline("list", server).arg(name).output().expect("run list");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .map(|line| line.split('\t').map(str::to_owned).collect())
        .collect()
}

fn millis(at: SystemTime) -> u128 {
    at.duration_since(UNIX_EPOCH).expect("after 1970").as_millis()
}

/// The milliseconds since the epoch of a `lock-delay until TIME` field,
/// checked to be UTC RFC 3339 with milliseconds, as `date -d` reads it.
fn until_millis(field: &str) -> u128 {
    let time = field
        .strip_prefix("lock-delay until ")
        .unwrap_or_else(|| panic!("not a lock-delay field: {field:?}"));
    let shape = time.len() == 24
        && time.char_indices().all(|(i, c)| match i {
            4 | 7 => c == '-',
            10 => c == 'T',
            13 | 16 => c == ':',
            19 => c == '.',
            23 => c == 'Z',
            _ => c.is_ascii_digit(),
        });
    assert!(shape, "not RFC 3339 UTC with milliseconds: {time:?}");
    let out = Command::new("date")
        .args(["-u", "-d", time, "+%s%3N"])
        .output()
        .expect("run date");
    assert!(out.status.success(), "date -d {time:?}: {}", text(&out.stderr));
    text(&out.stdout).trim().parse().expect("milliseconds")
}

/// Starts `lockline <subcommand> <server> <args>` and waits until `list`
/// shows `queued` entries of `name`.
fn queue_up(what: &str, command: Command, server: &[String], name: &str, queued: usize) -> Running {
    let running = Running::spawn(what, command);
    eventually(&format!("{what} queues"), || list(server, name).len() == queued);
    running
}

/// A holder killed outright: the waiter is held back for the delay, visibly.
/// `gone_after`: how soon after the kill the server removes the killed
/// holder's entry at the earliest (0 where the connection holds the lock; on
/// a TTL backend the TTL less one keepalive interval, the last renewal's
/// earliest time), from when the delay counts.
fn after_a_killed_holder(server: &[String], subcommand: &str, name: &str, gone_after: Duration) {
    let proposal: &[&str] = if subcommand == "elect" { &["p"] } else { &[] };
    let mut command = lockline(subcommand, server);
    command.arg(name).args(proposal).args(["--", "sleep", "60"]);
    let mut holder = Running::spawn("holder", command);
    let (held, _) = holder.holding();

    let mut command = lockline(subcommand, server);
    command.args(["--lock-delay", "1.5", name]).args(proposal).arg("true");
    let mut waiter = queue_up("waiter", command, server, name, 2);

    let killed_wall = SystemTime::now();
    let killed_at = Instant::now();
    holder.signal(libc::SIGKILL);
    holder.exits();

    // Election candidates are not marked (their value is their proclamation).
    let delayed = (subcommand == "lock").then(|| {
        let mut delayed = Vec::new();
        eventually("list shows the waiter in lock-delay", || {
            let queue = list(server, name);
            let listed_wall = SystemTime::now();
            match queue.iter().find(|line| line.len() == 5) {
                Some(line) => {
                    let until = until_millis(&line[4]);
                    assert!(
                        until >= millis(killed_wall) + (gone_after + DELAY).as_millis(),
                        "lock-delay until {until}, the kill at {}: {line:?}",
                        millis(killed_wall)
                    );
                    assert!(
                        until <= millis(listed_wall) + DELAY.as_millis(),
                        "lock-delay until {until}, later than the delay from now: {line:?}"
                    );
                    assert_ne!(line[0], held, "the killed holder in lock-delay: {queue:?}");
                    delayed = line.clone();
                    true
                }
                None => {
                    assert!(queue.iter().all(|line| line.len() == 4), "{queue:?}");
                    false
                }
            }
        });
        delayed
    });

    let (key, _) = waiter.holding();
    let took = killed_at.elapsed();
    eprintln!("{subcommand}: granted {took:?} after the holder was killed (lock-delay {DELAY:?})");
    assert!(
        took >= gone_after + DELAY,
        "{subcommand}: granted {took:?} after the holder was killed, its entry gone {gone_after:?} after it at the earliest"
    );
    assert!(took < DELAY + BOUND, "{took:?}");
    if let Some(delayed) = delayed {
        assert_eq!(delayed[0], key, "the one in lock-delay is the one granted: {delayed:?}");
    }
    assert_eq!(waiter.exits().code(), Some(0));
    assert!(list(server, name).is_empty(), "{:?}", list(server, name));
}

/// A holder whose command exits: a release, which hands on at once, except
/// where the backend documents it cannot tell (`held_back`: a ZooKeeper
/// election, whose Curator layout leaves a resignation no mark).
fn after_a_release(server: &[String], subcommand: &str, name: &str, held_back: bool) {
    let proposal: &[&str] = if subcommand == "elect" { &["p"] } else { &[] };
    let mut command = lockline(subcommand, server);
    command
        .arg(name)
        .args(proposal)
        .args(["sh", "-c", "read line; exit 0"])
        .stdin(Stdio::piped());
    let mut holder = Running::spawn("holder", command);
    holder.holding();

    let mut command = lockline(subcommand, server);
    command.args(["--lock-delay", "1.5", name]).args(proposal).arg("true");
    let mut waiter = queue_up("waiter", command, server, name, 2);

    let released_at = Instant::now();
    holder.close_stdin();
    waiter.holding();
    let took = released_at.elapsed();
    eprintln!("{subcommand}: granted {took:?} after the holder's command was told to exit (lock-delay {DELAY:?})");
    if held_back {
        assert!(took >= DELAY, "{subcommand}: granted {took:?} after a resignation");
    } else {
        assert!(took < DELAY, "{subcommand}: a release held the waiter back ({took:?})");
    }
    assert_eq!(holder.exits().code(), Some(0), "the holder released");
    assert_eq!(waiter.exits().code(), Some(0));
    assert!(list(server, name).is_empty(), "{:?}", list(server, name));
}

fn a_lock_delay_holds_back_after_a_killed_holder_only(server: &[String], gone_after: Duration) {
    let zookeeper = server.iter().any(|arg| arg == "--zookeeper");
    after_a_killed_holder(server, "lock", "delayed/killed", gone_after);
    after_a_release(server, "lock", "delayed/released", false);
    after_a_killed_holder(server, "elect", "delayed/killed-leader", gone_after);
    after_a_release(server, "elect", "delayed/resigned", zookeeper);
}

#[test]
fn a_lock_delay_holds_back_after_a_killed_holder_only_on_postgres() {
    let (_server, args) = support::postgres();
    a_lock_delay_holds_back_after_a_killed_holder_only(&args, Duration::ZERO);
}

#[test]
fn a_lock_delay_holds_back_after_a_killed_holder_only_on_mariadb() {
    let (_server, args) = support::mariadb();
    a_lock_delay_holds_back_after_a_killed_holder_only(&args, Duration::ZERO);
}

/// The TTL a TTL backend's holders get here.
const TTL: Duration = Duration::from_secs(2);

/// The server options, with a short TTL: a killed holder's lease, ZooKeeper
/// session or Redis entry then ends within 2 s of the kill.
fn short_ttl(mut server: Vec<String>) -> Vec<String> {
    server.extend(["--ttl".to_owned(), TTL.as_secs().to_string()]);
    server
}

/// The earliest a TTL backend removes a killed holder's entry after the
/// kill: its TTL from its last renewal, at most a keepalive interval (a
/// third of the TTL) before the kill.
const TTL_GONE_AFTER: Duration = Duration::from_millis(1333);

#[test]
fn a_lock_delay_holds_back_after_a_killed_holder_only_on_redis() {
    let server = lockline_testkit::RedisServer::start().expect("start redis");
    a_lock_delay_holds_back_after_a_killed_holder_only(
        &short_ttl(vec!["--redis".to_owned(), server.url()]),
        TTL_GONE_AFTER,
    );
}

#[test]
fn a_lock_delay_holds_back_after_a_killed_holder_only_on_etcd() {
    let cluster = lockline_testkit::EtcdCluster::start().expect("start etcd");
    a_lock_delay_holds_back_after_a_killed_holder_only(
        &short_ttl(vec!["--etcd".to_owned(), cluster.endpoints().join(",")]),
        TTL_GONE_AFTER,
    );
}

#[test]
fn a_lock_delay_holds_back_after_a_killed_holder_only_on_zookeeper() {
    let ensemble = lockline_testkit::ZkEnsemble::start().expect("start ZooKeeper");
    a_lock_delay_holds_back_after_a_killed_holder_only(
        &short_ttl(vec!["--zookeeper".to_owned(), ensemble.connect_string()]),
        TTL_GONE_AFTER,
    );
}
