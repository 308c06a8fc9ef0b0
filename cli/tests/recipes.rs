//! Every recipe from the command line, process against process on real
//! servers: `lock -s` (a shared lock: its holders hold together, an
//! exclusive `lock` waits for them), `lock --limit N` (a semaphore of N) and
//! `lock -n` (one try: a taken lock exits with `--conflict-exit-code`,
//! default 1, at once and without leaving an entry). `list` shows each kind,
//! and the command's `LOCKLINE_SEQUENCER` names the mode held. On etcd,
//! ZooKeeper (where a shared lock is a Curator read lock, `__READ__`) and
//! PostgreSQL.

mod support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use lockline_testkit::{EtcdCluster, ZkEnsemble};
use support::{eventually, lockline, Running, BOUND};

/// The `list` lines of `name`, split on tabs.
fn list(server: &[String], name: &str) -> Vec<Vec<String>> {
    let out = lockline("list", server).arg(name).output().expect("run list");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| line.split('\t').map(str::to_owned).collect())
        .collect()
}

/// The KIND column of `name`'s queue, the holder first.
fn kinds(server: &[String], name: &str) -> Vec<String> {
    list(server, name).into_iter().map(|line| line[3].clone()).collect()
}

/// `lock FLAGS NAME` running a command that prints its sequencer and holds
/// until its standard input is closed.
fn holder(what: &str, server: &[String], flags: &[&str], name: &str) -> Running {
    let mut command = lockline("lock", server);
    command
        .args(flags)
        .arg(name)
        .args(["sh", "-c", "echo \"$LOCKLINE_SEQUENCER\"; read line; exit 0"])
        .stdin(Stdio::piped());
    Running::spawn(what, command)
}

/// `lock FLAGS NAME true`, once `list` shows it queued as the `place`th
/// contender.
fn waiter(what: &str, server: &[String], flags: &[&str], name: &str, place: usize) -> Running {
    let mut command = lockline("lock", server);
    command.args(flags).args([name, "true"]);
    let waiter = Running::spawn(what, command);
    eventually(&format!("{what} queues"), || list(server, name).len() == place);
    waiter
}

/// Two `lock -s` hold at once; an exclusive `lock` behind them waits until
/// both are gone; the holders' sequencers say `read`.
fn shared_holders_hold_together(server: &[String], read_marker: Option<&str>) {
    let name = "recipes/shared";
    let mut first = holder("reader 1", server, &["-s"], name);
    let (key, token) = first.holding();
    assert_eq!(first.stdout_line(), format!("lockline1:read:{token}:{name}"));
    let mut second = holder("reader 2", server, &["--shared"], name);
    let (second_key, _) = second.holding();
    if let Some(marker) = read_marker {
        assert!(
            key.contains(marker) && second_key.contains(marker),
            "{key} {second_key}"
        );
    }
    assert!(second.stdout_line().starts_with("lockline1:read:"));
    let mut writer = waiter("writer", server, &[], name, 3);
    assert_eq!(kinds(server, name), ["read", "read", "mutex"]);
    // A shared lock asked for after the exclusive one waits behind it.
    let mut late = waiter("late reader", server, &["-s"], name, 4);
    first.close_stdin();
    assert_eq!(first.exits().code(), Some(0));
    assert!(!writer.has_exited(), "the writer ran while a reader held");
    second.close_stdin();
    assert_eq!(second.exits().code(), Some(0));
    writer.holding();
    assert_eq!(writer.exits().code(), Some(0));
    late.holding();
    assert_eq!(late.exits().code(), Some(0));
    assert!(list(server, name).is_empty(), "{:?}", list(server, name));
}

/// `--limit 2` admits two holders; a third waits until one of them goes.
fn a_limit_of_two_admits_two(server: &[String]) {
    let name = "recipes/limited";
    let mut first = holder("permit 1", server, &["--limit", "2"], name);
    let (_, token) = first.holding();
    assert_eq!(first.stdout_line(), format!("lockline1:permit-2:{token}:{name}"));
    let mut second = holder("permit 2", server, &["--limit=2"], name);
    second.holding();
    let mut third = waiter("permit 3", server, &["--limit", "2"], name, 3);
    assert_eq!(kinds(server, name), ["semaphore", "semaphore", "semaphore"]);
    assert!(!third.has_exited(), "a third holder of a limit of 2");
    // The third waits on the entry two places ahead of it, the first (the
    // semaphore's documented wait rule: herd-free, so a permit freed nearer
    // to it is taken once that one goes).
    first.close_stdin();
    assert_eq!(first.exits().code(), Some(0));
    third.holding();
    assert_eq!(third.exits().code(), Some(0));
    second.close_stdin();
    assert_eq!(second.exits().code(), Some(0));
    assert!(list(server, name).is_empty(), "{:?}", list(server, name));
}

/// `lock -n` on a taken lock exits with the conflict status at once (well
/// within the lock's TTL: it did not wait) and leaves no entry; on a free
/// one it runs the command.
fn nonblock_is_one_try(server: &[String]) {
    let name = "recipes/nonblock";
    let mut held = holder("holder", server, &[], name);
    let (key, _) = held.holding();
    let try_once = |flags: &[&str]| {
        let started = Instant::now();
        let out = lockline("lock", server)
            .args(flags)
            .args(["--ttl", "30", name, "echo", "ran"])
            .output()
            .expect("run lockline");
        let took = started.elapsed();
        assert!(out.stdout.is_empty(), "{flags:?}: the command ran");
        assert!(took < Duration::from_secs(10), "{flags:?}: took {took:?}");
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    for (flags, status) in [
        (&["-n"][..], 1),
        (&["--nonblock", "--conflict-exit-code", "7"][..], 7),
        (&["-n", "--conflict-exit-code=0"][..], 0),
        (&["-s", "-n"][..], 1),
        (&["-sn"][..], 1),
    ] {
        let (code, stderr) = try_once(flags);
        assert_eq!(code, Some(status), "{flags:?}: {stderr}");
        assert!(stderr.contains("is taken"), "{flags:?}: {stderr}");
        let queue = list(server, name);
        assert_eq!(queue.len(), 1, "{flags:?} left an entry: {queue:?}");
        assert_eq!(queue[0][0], key);
    }
    held.close_stdin();
    assert_eq!(held.exits().code(), Some(0));
    // Free: granted at once, the command's status is the exit status.
    let out = lockline("lock", server)
        .args(["-n", "--conflict-exit-code", "7", name, "sh", "-c", "exit 3"])
        .output()
        .expect("run lockline");
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    // A limit of 2 with one holder has a permit free.
    let mut one = holder("one permit", server, &["--limit", "2"], name);
    one.holding();
    let out = lockline("lock", server)
        .args(["-n", "--limit", "2", name, "true"])
        .output()
        .expect("run lockline");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    one.close_stdin();
    assert_eq!(one.exits().code(), Some(0));
    assert!(list(server, name).is_empty(), "{:?}", list(server, name));
}

/// `--timeout` bounds a shared lock's and a permit's wait as a mutex's
/// (124), and leaves no entry; a semaphore does not queue with a mutex under
/// one name (123).
fn timeouts_bound_every_recipe(server: &[String]) {
    let timed_out = |flags: &[&str], name: &str| {
        let out = lockline("lock", server)
            .args(flags)
            .args(["--timeout", "0.5", name, "true"])
            .output()
            .expect("run lockline");
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let name = "recipes/timeout";
    let mut held = holder("holder", server, &[], name);
    held.holding();
    let (code, stderr) = timed_out(&["-s"], name);
    assert_eq!(code, Some(124), "{stderr}");
    eventually("the timed-out entry goes", || list(server, name).len() == 1);
    let (code, stderr) = timed_out(&["--limit", "1"], name);
    assert_eq!(code, Some(123), "{stderr}");
    assert!(stderr.contains("one recipe kind per name"), "{stderr}");
    held.close_stdin();
    assert_eq!(held.exits().code(), Some(0));

    let name = "recipes/timeout-permit";
    let mut held = holder("permit holder", server, &["--limit", "1"], name);
    held.holding();
    let (code, stderr) = timed_out(&["--limit", "1"], name);
    assert_eq!(code, Some(124), "{stderr}");
    eventually("the timed-out entry goes", || list(server, name).len() == 1);
    held.close_stdin();
    assert_eq!(held.exits().code(), Some(0));
}

fn every_recipe(server: &[String], read_marker: Option<&str>) {
    let started = Instant::now();
    shared_holders_hold_together(server, read_marker);
    a_limit_of_two_admits_two(server);
    nonblock_is_one_try(server);
    timeouts_bound_every_recipe(server);
    assert!(started.elapsed() < 4 * BOUND);
}

#[test]
fn every_recipe_on_etcd() {
    let cluster = EtcdCluster::start().expect("start etcd");
    every_recipe(&["--etcd".to_owned(), cluster.endpoints().join(",")], None);
}

#[test]
fn every_recipe_on_zookeeper() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    // Curator's InterProcessReadWriteLock read node.
    every_recipe(
        &["--zookeeper".to_owned(), ensemble.connect_string()],
        Some("-__READ__"),
    );
}

#[test]
fn every_recipe_on_postgres() {
    let (_server, args) = support::postgres();
    every_recipe(&args, None);
}
