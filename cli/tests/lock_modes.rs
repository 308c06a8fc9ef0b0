//! `lockline lock --mode MODE`, process against process on a real server:
//! compatible modes hold together (two `PR`, a `CR` beside a `PW`, an `NL`
//! beside anything), an incompatible `-n` exits with the conflict status at
//! once and leaves no entry, a request waits behind an earlier incompatible
//! one, `--timeout` bounds the wait (124), a name is used by one recipe
//! kind at a time (123), `--lock-delay` holds a request back after an
//! involuntary loss, the command's `LOCKLINE_SEQUENCER` is `lock-MODE`
//! and `lockline check` answers it, `list` shows each entry's mode and
//! state (a conversion made through the library among them), and a lost
//! lock stops the command (120). On etcd, ZooKeeper, Redis, PostgreSQL and
//! MariaDB.

mod support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use lockline::{Client, LockMode};
use lockline_etcd::Etcd;
use lockline_redis::Redis;
use lockline_sql::Sql;
use lockline_testkit::{EtcdCluster, MariaDbServer, PgOptions, PgServer, RedisServer, ZkEnsemble};
use lockline_zookeeper::ZooKeeper;
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

/// The KIND and STATE columns of `name`'s queue, in queue order.
fn modes(server: &[String], name: &str) -> Vec<(String, String)> {
    list(server, name)
        .into_iter()
        .map(|line| {
            assert_eq!(line.len(), 5, "{line:?}");
            (line[3].clone(), line[4].clone())
        })
        .collect()
}

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected
        .iter()
        .map(|(kind, state)| ((*kind).to_owned(), (*state).to_owned()))
        .collect()
}

/// `lock --mode MODE NAME` running a command that prints its sequencer and
/// holds until its standard input is closed.
fn holder(what: &str, server: &[String], mode: &str, name: &str) -> Running {
    let mut command = lockline("lock", server);
    command
        .args(["--mode", mode, name])
        .args(["sh", "-c", "echo \"$LOCKLINE_SEQUENCER\"; read line; exit 0"])
        .stdin(Stdio::piped());
    Running::spawn(what, command)
}

/// `lock --mode MODE NAME true`, once `list` shows it queued as the
/// `place`th contender.
fn waiter(what: &str, server: &[String], mode: &str, name: &str, place: usize) -> Running {
    let mut command = lockline("lock", server);
    command.args(["--mode", mode, name, "true"]);
    let waiter = Running::spawn(what, command);
    eventually(&format!("{what} queues"), || list(server, name).len() == place);
    waiter
}

/// `lock FLAGS NAME echo ran`: its status and standard error; the command
/// must not have run unless `runs`.
fn one_try(server: &[String], flags: &[&str], name: &str, runs: bool) -> (Option<i32>, String) {
    let out = lockline("lock", server)
        .args(flags)
        .args([name, "echo", "ran"])
        .output()
        .expect("run lockline");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout == "ran\n", runs, "{flags:?}: {stdout:?}");
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `lockline check SEQUENCER`'s status.
fn check(server: &[String], sequencer: &str) -> Option<i32> {
    let out = lockline("check", server).arg(sequencer).output().expect("run check");
    out.status.code()
}

/// Two `--mode PR` hold together and `check` answers their `lock-PR`
/// sequencers; an `EX -n` is refused with the conflict status, leaving no
/// entry; a waiting `EX` is listed as waiting with no token, a `PR` asked
/// for after it waits behind it, an `NL` is granted past them all; the
/// `EX` holds once both readers are gone, then the late reader.
fn protected_readers_hold_together(server: &[String]) {
    let name = "modes/readers";
    let mut first = holder("reader 1", server, "PR", name);
    let (first_key, first_token) = first.holding();
    let first_sequencer = first.stdout_line();
    assert_eq!(first_sequencer, format!("lockline1:lock-PR:{first_token}:{name}"));
    // Any case.
    let mut second = holder("reader 2", server, "pr", name);
    let (second_key, second_token) = second.holding();
    assert_eq!(second.stdout_line(), format!("lockline1:lock-PR:{second_token}:{name}"));
    assert!(second_token > first_token, "{first_token} {second_token}");
    assert_eq!(check(server, &first_sequencer), Some(0), "a holder's sequencer");

    let queue = list(server, name);
    assert_eq!(queue.len(), 2, "{queue:?}");
    for (line, (key, token)) in queue
        .iter()
        .zip([(&first_key, first_token), (&second_key, second_token)])
    {
        assert_eq!(line.len(), 5, "{line:?}");
        assert_eq!((&line[0], &line[2]), (key, &token.to_string()), "{queue:?}");
        assert!(!line[1].is_empty() && line[1] != "-", "an owner: {line:?}");
        assert_eq!((line[3].as_str(), line[4].as_str()), ("lock-PR", "granted"));
    }

    // One try while they hold: the conflict status, at once, no entry left.
    for (flags, status) in [
        (&["--mode", "EX", "-n"][..], 1),
        (&["--mode=ex", "--nonblock", "--conflict-exit-code", "7"][..], 7),
        (&["-n", "--mode", "PW"][..], 1),
        (&["-n", "--mode", "CW"][..], 1),
    ] {
        let started = Instant::now();
        let (code, stderr) = one_try(server, flags, name, false);
        assert_eq!(code, Some(status), "{flags:?}: {stderr}");
        assert!(stderr.contains("is taken"), "{flags:?}: {stderr}");
        assert!(started.elapsed() < BOUND / 3, "{flags:?} waited");
        assert_eq!(list(server, name).len(), 2, "{flags:?} left an entry");
    }
    // `--timeout 0` is one try too, with timeout(1)'s status.
    let (code, stderr) = one_try(server, &["--mode", "EX", "--timeout", "0"], name, false);
    assert_eq!(code, Some(124), "{stderr}");
    assert!(stderr.contains("is taken"), "{stderr}");
    // Compatible: granted at once, the command's status passed on.
    let (code, stderr) = one_try(server, &["--mode", "CR", "-n"], name, true);
    assert_eq!(code, Some(0), "{stderr}");

    let mut writer = waiter("writer", server, "EX", name, 3);
    let queue = list(server, name);
    assert_eq!(queue[2][2], "-", "a waiting request has no token yet: {queue:?}");
    // Asked for after the waiting EX: it waits behind it, in line.
    let mut late = waiter("late reader", server, "PR", name, 4);
    assert_eq!(
        modes(server, name),
        pairs(&[
            ("lock-PR", "granted"),
            ("lock-PR", "granted"),
            ("lock-EX", "waiting"),
            ("lock-PR", "waiting"),
        ])
    );
    // NL is compatible with everything, waiting requests included: granted
    // past them, and listed after them.
    let (code, stderr) = one_try(server, &["--mode", "NL", "-n"], name, true);
    assert_eq!(code, Some(0), "{stderr}");
    let mut null = holder("null", server, "nl", name);
    null.holding();
    assert_eq!(
        modes(server, name),
        pairs(&[
            ("lock-PR", "granted"),
            ("lock-PR", "granted"),
            ("lock-EX", "waiting"),
            ("lock-PR", "waiting"),
            ("lock-NL", "granted"),
        ])
    );
    null.close_stdin();
    assert_eq!(null.exits().code(), Some(0));

    first.close_stdin();
    assert_eq!(first.exits().code(), Some(0));
    assert_eq!(
        check(server, &first_sequencer),
        Some(1),
        "a released holder's sequencer"
    );
    eventually("the first reader's entry goes", || list(server, name).len() == 3);
    assert!(!writer.has_exited(), "EX granted beside a PR holder");
    second.close_stdin();
    assert_eq!(second.exits().code(), Some(0));
    let (_, writer_token) = writer.holding();
    assert!(writer_token > second_token, "{second_token} {writer_token}");
    assert_eq!(writer.exits().code(), Some(0));
    late.holding();
    assert_eq!(late.exits().code(), Some(0));
    assert!(list(server, name).is_empty(), "{:?}", list(server, name));
}

/// A `CR` holds beside a `PW`; `CW` and a second `PW` do not (one try:
/// the conflict status); `list` shows both grants.
fn concurrent_read_beside_protected_write(server: &[String]) {
    let name = "modes/writer";
    let mut writer = holder("writer", server, "PW", name);
    let (_, token) = writer.holding();
    assert_eq!(writer.stdout_line(), format!("lockline1:lock-PW:{token}:{name}"));
    let mut reader = holder("reader", server, "CR", name);
    reader.holding();
    assert!(reader.stdout_line().starts_with("lockline1:lock-CR:"));
    assert_eq!(
        modes(server, name),
        pairs(&[("lock-PW", "granted"), ("lock-CR", "granted")])
    );
    for mode in ["CW", "PW", "PR", "EX"] {
        let (code, stderr) = one_try(server, &["-n", "--mode", mode], name, false);
        assert_eq!(code, Some(1), "{mode}: {stderr}");
    }
    assert_eq!(list(server, name).len(), 2);
    writer.close_stdin();
    assert_eq!(writer.exits().code(), Some(0));
    reader.close_stdin();
    assert_eq!(reader.exits().code(), Some(0));
    assert!(list(server, name).is_empty(), "{:?}", list(server, name));
}

/// `--timeout` bounds a lock-mode wait (124) and leaves no entry; a name
/// queued as a mutex refuses `--mode`, and the other way round (123).
fn timeouts_and_one_recipe_per_name(server: &[String]) {
    let name = "modes/timeout";
    let mut held = holder("holder", server, "EX", name);
    held.holding();
    let (code, stderr) = one_try(server, &["--mode", "PR", "--timeout", "0.5"], name, false);
    assert_eq!(code, Some(124), "{stderr}");
    assert!(stderr.contains("not acquired within"), "{stderr}");
    eventually("the timed-out entry goes", || list(server, name).len() == 1);
    let (code, stderr) = one_try(server, &["--timeout", "0.5"], name, false);
    assert_eq!(code, Some(123), "a mutex on a lock-mode name: {stderr}");
    assert!(stderr.contains("one recipe kind per name"), "{stderr}");
    held.close_stdin();
    assert_eq!(held.exits().code(), Some(0));

    let name = "modes/a-mutex";
    let mut command = lockline("lock", server);
    command
        .args([name, "sh", "-c", "read line; exit 0"])
        .stdin(Stdio::piped());
    let mut mutex = Running::spawn("mutex holder", command);
    mutex.holding();
    let (code, stderr) = one_try(server, &["--mode", "NL", "-n"], name, false);
    assert_eq!(code, Some(123), "a lock mode on a mutex's name: {stderr}");
    assert!(stderr.contains("one recipe kind per name"), "{stderr}");
    // The mutex's listing keeps its four fields.
    let queue = list(server, name);
    assert_eq!(queue.len(), 1, "{queue:?}");
    assert_eq!(queue[0].len(), 4, "{queue:?}");
    assert_eq!(queue[0][3], "mutex");
    mutex.close_stdin();
    assert_eq!(mutex.exits().code(), Some(0));
}

/// A holder converting (through the library) is listed as `converting to
/// MODE`, still with the mode it holds, until the conversion is granted.
fn a_conversion_is_listed(server: &[String], client: Client) {
    let name = "modes/converting";
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let session = runtime.block_on(client.session()).expect("session");
    let resource = session.resource(name).expect("resource");
    let mut guard = runtime.block_on(resource.lock(LockMode::Pr)).expect("lock PR");
    let library_token = guard.token().get();
    let mut cli = holder("cli reader", server, "PR", name);
    cli.holding();
    let converting = runtime.spawn(async move {
        guard.convert(LockMode::Ex).await.expect("convert to EX");
        guard
    });
    let mut queue = Vec::new();
    eventually("the conversion is listed", || {
        queue = list(server, name);
        queue.first().is_some_and(|line| line[4] != "granted")
    });
    assert_eq!(
        queue
            .iter()
            .map(|line| (line[3].as_str(), line[4].as_str()))
            .collect::<Vec<_>>(),
        [("lock-PR", "converting to EX"), ("lock-PR", "granted")],
        "{queue:?}"
    );
    assert_eq!(queue[0][2], library_token.to_string(), "the token held meanwhile");
    cli.close_stdin();
    assert_eq!(cli.exits().code(), Some(0));
    let guard = runtime
        .block_on(async { tokio::time::timeout(BOUND, converting).await })
        .expect("the conversion is granted")
        .expect("the conversion task");
    assert_eq!(guard.mode(), LockMode::Ex);
    let queue = list(server, name);
    assert_eq!(queue.len(), 1, "{queue:?}");
    assert_eq!((queue[0][3].as_str(), queue[0][4].as_str()), ("lock-EX", "granted"));
    assert_eq!(queue[0][2], guard.token().to_string());
    runtime.block_on(guard.release()).expect("release");
    runtime.block_on(session.close()).expect("close");
    assert!(list(server, name).is_empty());
}

/// A lock-mode holder whose session ends (its `lockline` stopped with
/// SIGSTOP past the TTL: nothing renews it, the server ends it): the `EX`
/// waiting behind it with `--lock-delay 2` is listed as waiting once the
/// holder's entry is gone and holds only after its delay; once resumed,
/// the old holder's `lockline` stops the command and exits 120, and its
/// sequencer is no longer current.
fn a_lost_lock_mode_stops_the_command(server: &[String]) {
    let name = "modes/lost";
    let mut command = lockline("lock", server);
    command
        .args(["--mode", "PW", "--ttl", "2", "--kill-after", "0.5", name])
        .args(["sh", "-c", "echo \"$$\"; echo \"$LOCKLINE_SEQUENCER\"; read line"])
        .stdin(Stdio::piped());
    let mut held = Running::spawn("holder", command);
    held.holding();
    let pid: libc::pid_t = held.stdout_line().parse().expect("the command's pid");
    let sequencer = held.stdout_line();
    assert!(sequencer.starts_with("lockline1:lock-PW:"), "{sequencer}");
    let mut command = lockline("lock", server);
    command.args(["--mode", "EX", "--lock-delay", "2", name, "true"]);
    let mut writer = Running::spawn("writer", command);
    eventually("the writer queues", || list(server, name).len() == 2);
    held.signal(libc::SIGSTOP);
    // The entry went after the start of the last listing that still showed
    // it: the writer, which saw it go later, holds 2 s after that at the
    // earliest. (Counted from when this test saw it gone instead, a loaded
    // machine's slow listing left less than the delay.)
    let mut present = Instant::now();
    eventually("the holder's entry goes", || {
        let looked = Instant::now();
        match list(server, name).as_slice() {
            [only] => {
                assert_eq!((only[3].as_str(), only[4].as_str()), ("lock-EX", "waiting"), "{only:?}");
                true
            }
            _ => {
                present = looked;
                false
            }
        }
    });
    writer.holding();
    let held_back = present.elapsed();
    assert!(held_back >= Duration::from_secs(2), "no lock-delay: {held_back:?}");
    assert_eq!(check(server, &sequencer), Some(1), "a lost holder's sequencer");
    held.signal(libc::SIGCONT);
    assert_eq!(held.exits().code(), Some(120));
    // SAFETY: kill(2) with signal 0 only asks whether the pid exists.
    assert_ne!(unsafe { libc::kill(pid, 0) }, 0, "the command outlived the lost lock");
    assert_eq!(writer.exits().code(), Some(0));
    assert!(list(server, name).is_empty(), "{:?}", list(server, name));
}

fn every_lock_mode_case(server: &[String], client: Client) {
    let started = Instant::now();
    protected_readers_hold_together(server);
    concurrent_read_beside_protected_write(server);
    timeouts_and_one_recipe_per_name(server);
    a_conversion_is_listed(server, client);
    a_lost_lock_mode_stops_the_command(server);
    assert!(started.elapsed() < 5 * BOUND);
}

#[test]
fn lock_modes_on_etcd() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let server = ["--etcd".to_owned(), cluster.endpoints().join(",")];
    every_lock_mode_case(&server, Client::new(Etcd::new(cluster.endpoints())));
}

#[test]
fn lock_modes_on_redis() {
    let redis = RedisServer::start().expect("start Redis");
    let server = ["--redis".to_owned(), redis.url()];
    every_lock_mode_case(&server, Client::new(Redis::new(redis.url())));
}

#[test]
fn lock_modes_on_zookeeper() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let server = ["--zookeeper".to_owned(), ensemble.connect_string()];
    every_lock_mode_case(&server, Client::new(ZooKeeper::new(ensemble.connect_string())));
}

#[test]
fn lock_modes_on_postgres() {
    let options = PgOptions {
        durable: false,
        ..Default::default()
    };
    let server = PgServer::start_with(&options).expect("start PostgreSQL");
    let flags = ["--postgres".to_owned(), server.url()];
    every_lock_mode_case(&flags, Client::new(Sql::new(server.url())));
}

#[test]
fn lock_modes_on_mariadb() {
    let server = MariaDbServer::start().expect("start MariaDB");
    server.create_database("cli").expect("create database");
    let url = format!("{}/cli", server.url());
    let flags = ["--mysql".to_owned(), url.clone()];
    every_lock_mode_case(&flags, Client::new(Sql::new(url)));
}
