//! Running the built `lockline` against the testkit's servers: its standard
//! output and error read line by line in the background, its exit status
//! awaited with a deadline, killed if a test drops it.

#![allow(dead_code)] // each test file uses a part

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

/// How long anything a test waits for may take.
pub const BOUND: Duration = Duration::from_secs(30);

/// The variables `lockline` reads, removed so that the test's own
/// environment does not leak in.
pub const VARIABLES: [&str; 9] = [
    "ETCDCTL_ENDPOINTS",
    "ZOOKEEPER_CONNECT",
    "DATABASE_URL",
    "ETCDCTL_CACERT",
    "ETCDCTL_CERT",
    "ETCDCTL_KEY",
    "ETCDCTL_USER",
    "ETCDCTL_PASSWORD",
    "LOCKLINE_ZK_AUTH",
];

/// `lockline <subcommand> <server...>` with a clean environment.
pub fn lockline(subcommand: &str, server: &[String]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lockline"));
    for var in VARIABLES {
        command.env_remove(var);
    }
    command.arg(subcommand).args(server).stdin(Stdio::null());
    command
}

/// The `lockline: holding KEY with fencing token N` line's key and token.
pub fn holding(line: &str) -> Option<(String, u64)> {
    let rest = line.strip_prefix("lockline: holding ")?;
    let (key, token) = rest.rsplit_once(" with fencing token ")?;
    Some((key.to_owned(), token.trim().parse().ok()?))
}

/// A running program whose output is read in the background.
pub struct Running {
    child: Child,
    stdout: Receiver<String>,
    stderr: Receiver<String>,
    what: String,
}

fn lines(reader: impl Read + Send + 'static, echo: Option<String>) -> Receiver<String> {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines() {
            let Ok(line) = line else { return };
            if let Some(what) = &echo {
                eprintln!("[{what}] {line}");
            }
            if sender.send(line).is_err() {
                return;
            }
        }
    });
    receiver
}

impl Running {
    /// Starts `command` with piped standard output and error.
    pub fn spawn(what: &str, mut command: Command) -> Running {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|error| panic!("start {what}: {error}"));
        let stdout = lines(child.stdout.take().expect("piped stdout"), None);
        let stderr = lines(child.stderr.take().expect("piped stderr"), Some(what.to_owned()));
        Running {
            child,
            stdout,
            stderr,
            what: what.to_owned(),
        }
    }

    /// The next line on standard output.
    pub fn stdout_line(&self) -> String {
        self.stdout
            .recv_timeout(BOUND)
            .unwrap_or_else(|_| panic!("{}: no line on standard output within {BOUND:?}", self.what))
    }

    /// Waits for the line saying what `lockline` holds, on standard error.
    pub fn holding(&self) -> (String, u64) {
        let end = Instant::now() + BOUND;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let line = self
                .stderr
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("{}: holds nothing after {BOUND:?}", self.what));
            if let Some(held) = holding(&line) {
                return held;
            }
        }
    }

    pub fn pid(&self) -> libc::pid_t {
        libc::pid_t::try_from(self.child.id()).expect("pid")
    }

    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on a child of this test.
        assert_eq!(
            unsafe { libc::kill(self.pid(), signal) },
            0,
            "signal {signal} to {}",
            self.what
        );
    }

    /// Closes its standard input (started piped): a command that reads it
    /// to the end then goes on.
    /// Writes a line to the program's standard input (spawned with it piped).
    pub fn send_line(&mut self, line: &str) {
        use std::io::Write;
        let stdin = self.child.stdin.as_mut().expect("standard input was not piped");
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .unwrap_or_else(|error| panic!("{}: write to standard input: {error}", self.what));
    }

    /// The first line on standard error (from now on) that holds `needle`.
    pub fn stderr_line_with(&self, needle: &str) -> String {
        let end = Instant::now() + BOUND;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let line = self.stderr.recv_timeout(left).unwrap_or_else(|_| {
                panic!(
                    "{}: no line with {needle:?} on standard error within {BOUND:?}",
                    self.what
                )
            });
            if line.contains(needle) {
                return line;
            }
        }
    }

    pub fn close_stdin(&mut self) {
        drop(self.child.stdin.take().expect("standard input was not piped"));
    }

    /// Whether it has exited already (its status is then kept for `exits`).
    pub fn has_exited(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_some()
    }

    /// Waits for the exit; a child is reaped only once, so polled.
    pub fn exits(&mut self) -> ExitStatus {
        let end = Instant::now() + BOUND;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(Instant::now() < end, "{} did not exit within {BOUND:?}", self.what);
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Everything left on standard output once it has exited.
    pub fn rest_of_stdout(&self) -> Vec<String> {
        let mut rest = Vec::new();
        while let Ok(line) = self.stdout.recv_timeout(BOUND) {
            rest.push(line);
        }
        rest
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `condition` (state of another process: no event to await) until it
/// holds, for at most [`BOUND`].
pub fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let end = Instant::now() + BOUND;
    while !condition() {
        assert!(Instant::now() < end, "{what}: not within {BOUND:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Revokes the lease of the etcd key `key` (`NAME/<lease hex>`) with
/// `etcdctl`, as an operator or an expiry would end its session.
pub fn revoke(cluster: &lockline_testkit::EtcdCluster, key: &str) {
    let lease = key.rsplit('/').next().expect("lease");
    let out = cluster
        .etcdctl(&cluster.endpoints())
        .args(["lease", "revoke", lease])
        .output()
        .expect("etcdctl");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A throwaway PostgreSQL (no fsync: its data does not outlive the test) and
/// the `--postgres URL` arguments for it, as its superuser.
pub fn postgres() -> (lockline_testkit::PgServer, Vec<String>) {
    let options = lockline_testkit::PgOptions {
        durable: false,
        ..Default::default()
    };
    let server = lockline_testkit::PgServer::start_with(&options).expect("start PostgreSQL");
    let args = vec!["--postgres".to_owned(), server.url()];
    (server, args)
}

/// A throwaway MariaDB with a database `cli`, and the `--mysql URL`
/// arguments for it, as root.
pub fn mariadb() -> (lockline_testkit::MariaDbServer, Vec<String>) {
    let server = lockline_testkit::MariaDbServer::start().expect("start MariaDB");
    server.create_database("cli").expect("create database cli");
    let args = vec!["--mysql".to_owned(), format!("{}/cli", server.url())];
    (server, args)
}
