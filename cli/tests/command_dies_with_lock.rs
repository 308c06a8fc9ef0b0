//! A command run by `lockline lock NAME COMMAND` dies with the lock: its whole
//! process group is stopped (SIGTERM, then SIGKILL after `--kill-after`) when
//! `lockline` is signalled or the lock is lost, the lock is released only once
//! the group is gone, the command dies with a SIGKILLed `lockline`, and a
//! signal while waiting leaves no entry in the queue. Real etcd and ZooKeeper,
//! and PostgreSQL and MariaDB for the group's stop on a signal or a loss and
//! for a signal while waiting.

use std::any::Any;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use lockline::conformance::{bounded, spawn_queued};
use lockline::{Client, Mutex, Session, SessionOptions};
use lockline_etcd::Etcd;
use lockline_sql::Sql;
use lockline_testkit::{EtcdCluster, MariaDbServer, PgOptions, PgServer, TcpProxy, ZkEnsemble};
use lockline_zookeeper::ZooKeeper;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A server for one test, how `lockline` reaches it (through a proxy when
/// the test cuts the network), and a client of its own for other contenders.
struct Server {
    cli: Vec<String>,
    proxy: Option<TcpProxy>,
    /// Connects directly, never through the proxy.
    client: Client,
    _server: Box<dyn Any>,
}

#[derive(Clone, Copy)]
enum Kind {
    Etcd,
    ZooKeeper,
    Postgres,
    MariaDb,
}

impl Server {
    fn start(kind: Kind, proxied: bool) -> Server {
        // A database URL, with `{address}` where the host and port go.
        let mut url = String::new();
        let (address, server, client, flag): (String, Box<dyn Any>, Client, &str) = match kind {
            Kind::Etcd => {
                let cluster = EtcdCluster::start().expect("start etcd");
                let address = format!("127.0.0.1:{}", cluster.client_port(0));
                let client = Client::new(Etcd::new(cluster.endpoints()));
                (address, Box::new(cluster), client, "--etcd")
            }
            Kind::ZooKeeper => {
                let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
                let address = ensemble.address(0);
                let client = Client::new(ZooKeeper::new(ensemble.connect_string()));
                (address, Box::new(ensemble), client, "--zookeeper")
            }
            Kind::Postgres => {
                let options = PgOptions {
                    durable: false,
                    ..Default::default()
                };
                let server = PgServer::start_with(&options).expect("start PostgreSQL");
                let address = format!("127.0.0.1:{}", server.port());
                url = server.url().replacen(&address, "{address}", 1);
                let client = Client::new(Sql::new(server.url()));
                (address, Box::new(server), client, "--postgres")
            }
            Kind::MariaDb => {
                let server = MariaDbServer::start().expect("start MariaDB");
                server.create_database("cli").expect("create database");
                let address = format!("127.0.0.1:{}", server.port());
                let direct = format!("{}/cli", server.url());
                url = direct.replacen(&address, "{address}", 1);
                let client = Client::new(Sql::new(direct));
                (address, Box::new(server), client, "--mysql")
            }
        };
        let proxy = proxied.then(|| TcpProxy::start(&address).expect("start the proxy"));
        let reached = proxy.as_ref().map_or(address, TcpProxy::address);
        let reached = match kind {
            Kind::Etcd => format!("http://{reached}"),
            Kind::ZooKeeper => reached,
            Kind::Postgres | Kind::MariaDb => url.replacen("{address}", &reached, 1),
        };
        Server {
            cli: vec![flag.to_owned(), reached],
            proxy,
            client,
            _server: server,
        }
    }

    /// `lockline lock <server> --print-key <args...>` (the held key on
    /// standard output even with a command), killed if the test drops it.
    fn lockline(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_lockline"));
        command
            .arg("lock")
            .args(&self.cli)
            .arg("--print-key")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        command
    }

    async fn session(&self) -> Session {
        let options = SessionOptions::new().with_ttl(Duration::from_secs(10));
        bounded("open a session", self.client.session_with(options))
            .await
            .expect("session")
    }
}

/// Reads the key `lockline` prints once it holds the lock.
async fn holds(child: &mut Child) -> String {
    let stdout = child.stdout.take().expect("piped stdout");
    let mut line = String::new();
    bounded("lockline holds the lock", BufReader::new(stdout).read_line(&mut line))
        .await
        .expect("read the key");
    assert!(!line.trim().is_empty(), "lockline printed no key");
    line.trim().to_owned()
}

async fn exits(what: &str, child: &mut Child) -> ExitStatus {
    bounded(what, child.wait()).await.expect("wait for lockline")
}

fn send(child: &Child, signal: libc::c_int) {
    let pid = libc::pid_t::try_from(child.id().expect("lockline runs")).expect("pid");
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "signal {signal} to lockline");
}

/// Whether `pid` is a process that can still run (not gone, not a zombie).
fn running(pid: libc::pid_t) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| !matches!(state, "Z" | "X" | "x")),
        Err(_) => false,
    }
}

/// Waits for another process to write `path`: there is no event to await,
/// so it polls with a deadline, as the testkit does for server readiness.
async fn appears(path: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            if text.ends_with('\n') {
                return text;
            }
        }
        assert!(Instant::now() < deadline, "{} did not appear", path.display());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn pid_in(path: &Path) -> libc::pid_t {
    appears(path).await.trim().parse().expect("a pid")
}

/// Waits until `mutex` has `n` contenders (another process queues: polled).
async fn contenders(mutex: &Mutex, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let queued = mutex.contenders().await.expect("list contenders").len();
        if queued == n {
            return;
        }
        assert!(Instant::now() < deadline, "{queued} contenders, expected {n}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A directory for one test's files, and SIGKILL for every pid written there
/// as `*.pid` when the test ends (so that a failing test leaves nothing).
struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new() -> Scratch {
        Scratch {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn arg(&self) -> &str {
        self.dir.path().to_str().expect("utf-8 temp dir")
    }

    /// Writes the stubborn command: a shell that ignores SIGTERM and starts a
    /// grandchild (another shell, in its group, also ignoring SIGTERM); both
    /// append to `log` until killed and write their pids.
    fn stubborn_command(&self) -> String {
        let script = self.path("stubborn.sh");
        std::fs::write(
            &script,
            r#"trap '' TERM
echo $$ > "$1/child.pid"
sh -c 'echo $$ > "$1/grandchild.pid"; while :; do echo grandchild >> "$1/log"; sleep 0.01; done' grandchild "$1" &
while :; do echo child >> "$1/log"; sleep 0.01; done
"#,
        )
        .expect("write the script");
        script.to_str().expect("utf-8 path").to_owned()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for name in ["child.pid", "grandchild.pid", "command.pid", "background.pid"] {
            if let Some(pid) = std::fs::read_to_string(self.path(name))
                .ok()
                .and_then(|text| text.trim().parse::<libc::pid_t>().ok())
            {
                // SAFETY: kill(2); the pid was written by this test's command.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

/// SIGTERM to `lockline` while a command that ignores SIGTERM holds: the
/// whole group (the shell and its grandchild) is SIGKILLed after the grace,
/// `lockline` exits 143, and the next holder (queued meanwhile) starts only
/// after the first command's last write.
async fn sigterm_stops_the_group_before_the_next_holder(kind: Kind) {
    let server = Server::start(kind, false);
    let scratch = Scratch::new();
    let script = scratch.stubborn_command();
    let grace = Duration::from_secs(1);
    let mut first = server
        .lockline(&[
            "--ttl",
            "5",
            "--kill-after",
            "1",
            "group/lock",
            "sh",
            &script,
            scratch.arg(),
        ])
        .spawn()
        .expect("start the first holder");
    holds(&mut first).await;
    let child = pid_in(&scratch.path("child.pid")).await;
    let grandchild = pid_in(&scratch.path("grandchild.pid")).await;
    let log = scratch.path("log");
    let log_arg = log.to_str().expect("utf-8 path");
    let mut second = server
        .lockline(&[
            "--ttl",
            "5",
            "group/lock",
            "sh",
            "-c",
            "echo second >> \"$1\"",
            "second",
            log_arg,
        ])
        .spawn()
        .expect("start the second contender");
    let session = server.session().await;
    let mutex = session.mutex("group/lock").expect("mutex");
    contenders(&mutex, 2).await;

    send(&first, libc::SIGTERM);
    let signalled = Instant::now();
    let status = exits("the first lockline exits", &mut first).await;
    let took = signalled.elapsed();
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status}");
    assert!(
        took >= grace,
        "exited {took:?} after SIGTERM: SIGKILL came before the grace"
    );
    assert!(!running(child), "the command outlived lockline");
    assert!(!running(grandchild), "the command's grandchild outlived lockline");

    holds(&mut second).await;
    let status = exits("the second lockline runs its command", &mut second).await;
    assert!(status.success(), "{status}");
    let written = std::fs::read_to_string(&log).expect("read the log");
    let lines: Vec<&str> = written.lines().collect();
    assert!(lines.contains(&"child") && lines.contains(&"grandchild"), "{written}");
    assert_eq!(
        lines.iter().position(|l| *l == "second"),
        Some(lines.len() - 1),
        "the second holder started before the first command's last write:\n{written}"
    );
    session.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_group_before_the_next_holder_on_etcd() {
    sigterm_stops_the_group_before_the_next_holder(Kind::Etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_group_before_the_next_holder_on_zookeeper() {
    sigterm_stops_the_group_before_the_next_holder(Kind::ZooKeeper).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_group_before_the_next_holder_on_postgres() {
    sigterm_stops_the_group_before_the_next_holder(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_group_before_the_next_holder_on_mariadb() {
    sigterm_stops_the_group_before_the_next_holder(Kind::MariaDb).await;
}

/// The lock lost while held (the holder's connection silently cut until its
/// session is declared lost): `lockline` exits 120 and the whole group, shell
/// grandchild and SIGTERM-ignoring command included, is gone by then.
async fn a_lost_lock_stops_the_group(kind: Kind) {
    let server = Server::start(kind, true);
    let scratch = Scratch::new();
    let script = scratch.stubborn_command();
    let mut holder = server
        .lockline(&[
            "--ttl",
            "2",
            "--kill-after",
            "0.5",
            "lost/lock",
            "sh",
            &script,
            scratch.arg(),
        ])
        .spawn()
        .expect("start the holder");
    holds(&mut holder).await;
    let child = pid_in(&scratch.path("child.pid")).await;
    let grandchild = pid_in(&scratch.path("grandchild.pid")).await;
    assert!(running(child) && running(grandchild));

    server.proxy.as_ref().expect("proxied").blackhole();
    let status = exits("lockline notices the loss and exits", &mut holder).await;
    assert_eq!(status.code(), Some(120), "{status}");
    assert!(!running(child), "the command outlived the lost lock");
    assert!(!running(grandchild), "the command's grandchild outlived the lost lock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_stops_the_group_on_etcd() {
    a_lost_lock_stops_the_group(Kind::Etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_stops_the_group_on_zookeeper() {
    a_lost_lock_stops_the_group(Kind::ZooKeeper).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_stops_the_group_on_postgres() {
    a_lost_lock_stops_the_group(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_stops_the_group_on_mariadb() {
    a_lost_lock_stops_the_group(Kind::MariaDb).await;
}

/// SIGINT while `lockline` waits in line: it exits 130 at once and its entry
/// is gone from the server, so a contender queued behind it is granted as
/// soon as the holder releases, well before the dead waiter's TTL (10 s).
async fn sigint_while_waiting_leaves_the_queue(kind: Kind) {
    let server = Server::start(kind, false);
    let session = server.session().await;
    let mutex = session.mutex("queue/lock").expect("mutex");
    let holder = mutex.lock().await.expect("lock");
    let mut waiter = server
        .lockline(&["--ttl", "10", "queue/lock", "true"])
        .spawn()
        .expect("start the waiter");
    contenders(&mutex, 2).await;

    // A third contender, queued behind lockline.
    let third_session = server.session().await;
    let third = third_session.mutex("queue/lock").expect("mutex");
    let third = spawn_queued(&server.client, async move { third.lock().await }).await;
    contenders(&mutex, 3).await;

    send(&waiter, libc::SIGINT);
    let signalled = Instant::now();
    let status = exits("the waiting lockline exits", &mut waiter).await;
    assert_eq!(status.code(), Some(128 + libc::SIGINT), "{status}");
    let took = signalled.elapsed();
    assert!(took < Duration::from_secs(5), "took {took:?} to exit on SIGINT");

    holder.release().await.expect("release");
    let released = Instant::now();
    let guard = bounded("the third contender is granted", third)
        .await
        .expect("task")
        .expect("lock");
    let waited = released.elapsed();
    assert!(
        waited < Duration::from_secs(5),
        "granted {waited:?} after the release: the signalled waiter's entry stayed"
    );
    guard.release().await.expect("release");
    third_session.close().await.expect("close");
    session.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_while_waiting_leaves_the_queue_on_etcd() {
    sigint_while_waiting_leaves_the_queue(Kind::Etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_while_waiting_leaves_the_queue_on_zookeeper() {
    sigint_while_waiting_leaves_the_queue(Kind::ZooKeeper).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_while_waiting_leaves_the_queue_on_postgres() {
    sigint_while_waiting_leaves_the_queue(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_while_waiting_leaves_the_queue_on_mariadb() {
    sigint_while_waiting_leaves_the_queue(Kind::MariaDb).await;
}

/// `lockline` killed with SIGKILL (it can clean nothing up): the kernel kills
/// its command through the parent-death signal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_dies_with_a_killed_lockline() {
    let server = Server::start(Kind::Etcd, false);
    let scratch = Scratch::new();
    let pid_file = scratch.path("command.pid");
    let mut holder = server
        .lockline(&[
            "--ttl",
            "2",
            "killed/lock",
            "sh",
            "-c",
            "echo $$ > \"$1\"; exec sleep 600",
            "command",
            pid_file.to_str().expect("utf-8 path"),
        ])
        .spawn()
        .expect("start the holder");
    holds(&mut holder).await;
    let command = pid_in(&pid_file).await;
    assert!(running(command));

    holder.start_kill().expect("SIGKILL lockline");
    exits("lockline dies", &mut holder).await;
    // The kernel delivers the parent-death signal as lockline exits; polled.
    let deadline = Instant::now() + Duration::from_secs(5);
    while running(command) {
        assert!(Instant::now() < deadline, "the command outlived a SIGKILLed lockline");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A command killed by signal N gives 128 + N, as a shell reports it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_killed_by_a_signal_exits_128_plus_its_number() {
    let server = Server::start(Kind::Etcd, false);
    let status = server
        .lockline(&["signalled/lock", "sh", "-c", "kill -KILL $$"])
        .output()
        .await
        .expect("run");
    assert_eq!(status.status.code(), Some(128 + libc::SIGKILL), "{:?}", status.status);
}

/// A signal to `lockline` (SIGINT, SIGHUP, SIGQUIT) stops a command that
/// obeys SIGTERM at once (no waiting out the grace); `lockline` exits 128 +
/// the signal and the lock is free right after.
async fn a_signal_stops_an_obedient_command(signal: libc::c_int) {
    let server = Server::start(Kind::Etcd, false);
    let scratch = Scratch::new();
    let pid_file = scratch.path("command.pid");
    let mut holder = server
        .lockline(&[
            "--kill-after",
            "30",
            "obedient/lock",
            "sh",
            "-c",
            "echo $$ > \"$1\"; exec sleep 600",
            "command",
            pid_file.to_str().expect("utf-8 path"),
        ])
        .spawn()
        .expect("start the holder");
    holds(&mut holder).await;
    let command = pid_in(&pid_file).await;
    send(&holder, signal);
    let signalled = Instant::now();
    let status = exits("lockline exits", &mut holder).await;
    assert_eq!(status.code(), Some(128 + signal), "{status}");
    let took = signalled.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "took {took:?}: the grace was waited out"
    );
    assert!(!running(command), "the command outlived lockline");
    let session = server.session().await;
    let free = session
        .mutex("obedient/lock")
        .expect("mutex")
        .try_lock()
        .await
        .expect("try_lock");
    assert!(free.is_some(), "the lock was not released");
    session.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_stops_an_obedient_command_without_waiting_the_grace() {
    a_signal_stops_an_obedient_command(libc::SIGINT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_stops_an_obedient_command_without_waiting_the_grace() {
    a_signal_stops_an_obedient_command(libc::SIGHUP).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigquit_stops_an_obedient_command_without_waiting_the_grace() {
    a_signal_stops_an_obedient_command(libc::SIGQUIT).await;
}

/// The state letter of `pid` in `/proc` (`S`, `R`, `T` for stopped, ...).
fn state(pid: libc::pid_t) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().next().map(str::to_owned)
}

/// Waits until `pid` is (or is no longer) stopped; the kernel's job-control
/// stops are not events a test can await, so this polls with a deadline.
async fn stopped(pid: libc::pid_t, what: &str, want: bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while (state(pid).as_deref() == Some("T")) != want {
        assert!(
            Instant::now() < deadline,
            "{what} (pid {pid}) is in state {:?}, wanted stopped = {want}",
            state(pid)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Ctrl-Z (SIGTSTP) to `lockline` pauses the command with it, rather than
/// leaving the command running while nothing supervises it; SIGCONT resumes
/// both, and SIGTERM afterwards still stops the command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigtstp_pauses_the_command_along_with_lockline() {
    let server = Server::start(Kind::Etcd, false);
    let scratch = Scratch::new();
    let pid_file = scratch.path("command.pid");
    let mut holder = server
        .lockline(&[
            "--ttl",
            "30",
            "paused/lock",
            "sh",
            "-c",
            "echo $$ > \"$1\"; exec sleep 600",
            "command",
            pid_file.to_str().expect("utf-8 path"),
        ])
        .spawn()
        .expect("start the holder");
    holds(&mut holder).await;
    let command = pid_in(&pid_file).await;
    let lockline = libc::pid_t::try_from(holder.id().expect("runs")).expect("pid");

    send(&holder, libc::SIGTSTP);
    stopped(lockline, "lockline", true).await;
    stopped(command, "the command", true).await;

    send(&holder, libc::SIGCONT);
    stopped(lockline, "lockline", false).await;
    stopped(command, "the command", false).await;

    send(&holder, libc::SIGTERM);
    let status = exits("lockline exits", &mut holder).await;
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status}");
    assert!(!running(command), "the command outlived lockline");
}

/// A command that exits leaving a background job in its group: the job is
/// gone by the time `lockline` exits, and the command's status is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_jobs_of_the_command_do_not_outlive_the_lock() {
    let server = Server::start(Kind::Etcd, false);
    let scratch = Scratch::new();
    let pid_file = scratch.path("background.pid");
    let output = server
        .lockline(&[
            "background/lock",
            "sh",
            "-c",
            "sleep 600 >/dev/null 2>&1 & echo $! > \"$1\"; exit 5",
            "command",
            pid_file.to_str().expect("utf-8 path"),
        ])
        .output();
    let output = bounded("lockline exits", output).await.expect("run");
    assert_eq!(output.status.code(), Some(5), "{:?}", output.status);
    let background = pid_in(&pid_file).await;
    assert!(!running(background), "the background job outlived the lock");
}
