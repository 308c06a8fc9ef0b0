//! `lockline check SEQUENCER` against holders run by `lockline lock` and
//! `lockline elect`, whose commands pass their `LOCKLINE_SEQUENCER` out: exit
//! 0 while the holder holds (a waiter behind it changes nothing), 1 once it
//! released and for a later holder's turn, 1 for a waiter's token or another
//! mode; on etcd and PostgreSQL. A malformed sequencer exits 123 without a
//! connection to the server; a well-formed one exits 122 when the server is
//! out of reach (a closed port, a port that never answers).

mod support;

use std::io::ErrorKind;
use std::net::TcpListener;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use lockline_testkit::{free_port, EtcdCluster};
use support::{eventually, lockline, Running};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `lockline check <server> <args>`.
fn check(server: &[String], args: &[&str]) -> Output {
    let out = lockline("check", server).args(args).output().expect("run check");
    assert!(!text(&out.stderr).contains("panicked"), "{}", text(&out.stderr));
    out
}

/// The exit status of `lockline check SEQUENCER`, which prints nothing.
fn status(server: &[String], sequencer: &str) -> i32 {
    let out = check(server, &[sequencer]);
    assert!(out.stdout.is_empty(), "check printed {:?}", text(&out.stdout));
    out.status
        .code()
        .unwrap_or_else(|| panic!("check {sequencer}: {:?} {}", out.status, text(&out.stderr)))
}

/// What `lockline check --verbose SEQUENCER` prints, with its status.
fn verbose(server: &[String], sequencer: &str) -> (i32, String) {
    let out = check(server, &["--verbose", sequencer]);
    (out.status.code().expect("an exit status"), text(&out.stdout))
}

/// `lockline <subcommand> <server> <args> sh -c ...`: the command prints its
/// `LOCKLINE_SEQUENCER` and holds until its standard input is closed, then
/// exits 0. Returns it with the sequencer, once it holds.
fn holder(what: &str, subcommand: &str, server: &[String], args: &[&str]) -> Running {
    let mut command = lockline(subcommand, server);
    command
        .args(args)
        .args(["sh", "-c", "printf '%s\\n' \"$LOCKLINE_SEQUENCER\"; read line; exit 0"])
        .stdin(Stdio::piped());
    Running::spawn(what, command)
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

fn a_sequencer_is_current_only_while_its_holder_holds(server: &[String]) {
    // A name with a space: percent-encoded in the sequencer.
    let (name, encoded) = ("checked/run 1", "checked/run%201");
    let mut first = holder("first", "lock", server, &[name]);
    let first_sequencer = first.stdout_line();
    let (_, first_token) = first.holding();
    assert_eq!(first_sequencer, format!("lockline1:mutex:{first_token}:{encoded}"));
    assert_eq!(status(server, &first_sequencer), 0, "a holder's sequencer is current");
    assert_eq!(verbose(server, &first_sequencer), (0, "current\n".to_owned()));

    // A waiter behind it: the holder stays current, the waiter is not.
    let mut second = holder("second", "lock", server, &[name]);
    let mut queue = Vec::new();
    eventually("the second queues", || {
        queue = list(server, name);
        queue.len() == 2
    });
    let waiting_token: u64 = queue[1][2].parse().expect("a token");
    assert_eq!(
        status(server, &first_sequencer),
        0,
        "a waiter does not make the holder stale"
    );
    let waiting = format!("lockline1:mutex:{waiting_token}:{encoded}");
    assert_eq!(status(server, &waiting), 1, "a waiter's token is not current");
    let other_mode = format!("lockline1:write:{first_token}:{encoded}");
    assert_eq!(status(server, &other_mode), 1, "the holder's token in another mode");

    // The first exits (its command ended: released); the second's turn.
    first.close_stdin();
    assert_eq!(first.exits().code(), Some(0));
    let second_sequencer = second.stdout_line();
    let (_, second_token) = second.holding();
    assert_eq!(second_token, waiting_token, "{queue:?}");
    assert_eq!(second_sequencer, waiting);
    assert_eq!(status(server, &first_sequencer), 1, "stale after its release");
    assert_eq!(verbose(server, &first_sequencer), (1, "not current\n".to_owned()));
    assert_eq!(status(server, &second_sequencer), 0);
    second.close_stdin();
    assert_eq!(second.exits().code(), Some(0));
    assert_eq!(status(server, &second_sequencer), 1, "stale after its release");

    // A leader's, under `elect`.
    let mut leader = holder("leader", "elect", server, &["checked/lead", "proposal"]);
    let leader_sequencer = leader.stdout_line();
    let (_, leader_token) = leader.holding();
    assert_eq!(
        leader_sequencer,
        format!("lockline1:leader:{leader_token}:checked/lead")
    );
    assert_eq!(status(server, &leader_sequencer), 0, "a leader's sequencer is current");
    leader.close_stdin();
    assert_eq!(leader.exits().code(), Some(0));
    assert_eq!(status(server, &leader_sequencer), 1, "stale after resigning");
}

#[test]
fn a_sequencer_is_current_only_while_its_holder_holds_on_etcd() {
    let cluster = EtcdCluster::start().expect("start etcd");
    a_sequencer_is_current_only_while_its_holder_holds(&["--etcd".to_owned(), cluster.endpoints().join(",")]);
}

#[test]
fn a_sequencer_is_current_only_while_its_holder_holds_on_postgres() {
    let (_server, args) = support::postgres();
    a_sequencer_is_current_only_while_its_holder_holds(&args);
}

/// How long `check` may take to give up on a server: the session's connect
/// timeout (5 s), plus room for a loaded machine.
const CONNECT_DEADLINE: Duration = Duration::from_secs(10);

/// Whether someone connected to `listener` (it never accepts: a connection
/// waits in its backlog, found here).
fn connected(listener: &TcpListener) -> bool {
    match listener.accept() {
        Ok(_) => true,
        Err(error) if error.kind() == ErrorKind::WouldBlock => false,
        Err(error) => panic!("accept: {error}"),
    }
}

/// Malformed sequencers exit 123 in one line and connect to nothing, though
/// a server is named; a well-formed one then does connect, and exits 122
/// when nothing answers there (a listener that never speaks) or nothing
/// listens (a closed port), within the connect deadline. etcd and
/// PostgreSQL.
#[test]
fn a_malformed_sequencer_exits_123_before_anything_is_contacted() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let silent = listener.local_addr().expect("address").port();
    let closed = free_port().expect("port");
    let etcd = |port: u16| vec!["--etcd".to_owned(), format!("http://127.0.0.1:{port}")];
    let postgres = |port: u16| {
        vec![
            "--postgres".to_owned(),
            format!("postgres://app:pw@127.0.0.1:{port}/app"),
        ]
    };
    for server in [etcd(silent), postgres(silent)] {
        for malformed in [
            "",
            "checked/run",
            "lockline2:mutex:7:checked/run",
            "lockline1:mutex:seven:checked/run",
            "lockline1:exclusive:7:checked/run",
            "lockline1:mutex:7:",
            "lockline1:mutex:7:checked/run 1",
            "lockline1:mutex:7:checked%2",
            // Well-formed, but no lock can have this name.
            "lockline1:mutex:7:checked//run",
        ] {
            let out = check(&server, &[malformed]);
            let stderr = text(&out.stderr);
            assert_eq!(out.status.code(), Some(123), "{server:?} {malformed:?}: {stderr}");
            assert_eq!(stderr.lines().count(), 1, "{malformed:?}: {stderr}");
            assert!(out.stdout.is_empty(), "{malformed:?}");
            assert!(
                !connected(&listener),
                "{server:?} {malformed:?}: the server was contacted"
            );
        }
        let started = Instant::now();
        let out = check(&server, &["lockline1:mutex:7:checked/run"]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(122), "{server:?}, a silent server: {stderr}");
        assert!(stderr.contains("unavailable"), "{stderr}");
        assert!(started.elapsed() < CONNECT_DEADLINE, "took {:?}", started.elapsed());
        assert!(
            connected(&listener),
            "{server:?}: a well-formed sequencer was not even sent"
        );
        while connected(&listener) {}
    }
    for server in [etcd(closed), postgres(closed)] {
        let started = Instant::now();
        let out = check(&server, &["--verbose", "lockline1:leader:7:checked/run"]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(122), "{server:?}, a closed port: {stderr}");
        assert!(stderr.contains("unavailable"), "{stderr}");
        assert!(out.stdout.is_empty(), "no answer printed: {}", text(&out.stdout));
        assert!(started.elapsed() < CONNECT_DEADLINE, "took {:?}", started.elapsed());
    }
}
