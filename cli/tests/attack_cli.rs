//! Attacks on `lockline lock NAME COMMAND` and the exit statuses the README
//! promises. Real etcd; std processes (no async process plumbing needed).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use lockline_testkit::EtcdCluster;

fn lockline(cluster: &EtcdCluster, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lockline"));
    command
        .arg("lock")
        .arg("--etcd")
        .arg(cluster.endpoints().join(","))
        .args(args)
        .stdin(Stdio::null());
    command
}

fn wait(child: &mut Child, within: Duration) -> ExitStatus {
    let end = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        assert!(Instant::now() < end, "lockline did not exit within {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn send(child: &Child, signal: libc::c_int) {
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, signal) }, 0);
}

fn running(pid: libc::pid_t) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| !matches!(state, "Z" | "X" | "x"))
    })
}

fn read_pid(path: &std::path::Path) -> libc::pid_t {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            if let Ok(pid) = text.trim().parse() {
                return pid;
            }
        }
        assert!(Instant::now() < end, "no pid in {path:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn keys(cluster: &EtcdCluster, prefix: &str) -> Vec<String> {
    let out = cluster
        .etcdctl(&cluster.endpoints())
        .args(["get", "--prefix", "--keys-only", prefix])
        .output()
        .expect("etcdctl");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

fn revoke(cluster: &EtcdCluster, key: &str) {
    let lease = key.rsplit('/').next().expect("lease");
    let out = cluster
        .etcdctl(&cluster.endpoints())
        .args(["lease", "revoke", lease])
        .output()
        .expect("etcdctl");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// README: on SIGTERM "the lock is released only after no process of the
/// group runs any more, so the next holder never overlaps with it". Here
/// lockline's stderr is a pipe whose reader has gone (a log shipper that
/// died, `2>&1 | head`): lockline's own diagnostics fail.
#[test]
fn sigterm_with_a_closed_stderr_leaves_the_command_s_group_running() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let dir = tempfile::tempdir().expect("tempdir");
    let bg = dir.path().join("bg");
    let script = format!("sleep 300 & echo $! > {}; wait", bg.display());
    let mut child = lockline(&cluster, &["--ttl", "2", "att/stderr", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn lockline");
    let mut key = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut key)
        .expect("key");
    let mut holding = String::new();
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
    stderr.read_line(&mut holding).expect("holding line");
    drop(stderr); // the reader of lockline's stderr goes away
    let bg = read_pid(&bg);
    send(&child, libc::SIGTERM);
    let status = wait(&mut child, Duration::from_secs(10));
    let survived = running(bg);
    // The lock is freed by the server after the TTL; the next holder is granted
    // while the first command's process may still run.
    let next = lockline(&cluster, &["--timeout", "10", "att/stderr", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("next holder");
    let overlap = running(bg);
    // SAFETY: kill(2) of a process this test started.
    unsafe { libc::kill(bg, libc::SIGKILL) };
    assert!(
        !survived && !overlap,
        "lockline exited {status:?} on SIGTERM while the command's background process {bg} still ran \
         (next holder exit {next:?}, overlap with it: {overlap})"
    );
    assert_eq!(status.code(), Some(143), "exit status on SIGTERM");
}

/// An unwritable stdout (here /dev/full) when lockline prints the held key.
/// README: exit statuses are the command's, 3, 2, 1 or 128 + N; DESIGN: no
/// panic on a path a caller can reach.
#[test]
fn an_unwritable_stdout_panics_and_leaves_the_key() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full");
    let out = lockline(&cluster, &["--ttl", "10", "att/full", "true"])
        .stdout(full)
        .stderr(Stdio::piped())
        .output()
        .expect("lockline");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let left = keys(&cluster, "att/full");
    assert!(
        !stderr.contains("panicked") && [0, 1].contains(&out.status.code().unwrap_or(-1)) && left.is_empty(),
        "status {:?}, keys left {left:?}, stderr: {stderr}",
        out.status
    );
}

/// README: "128 + N when lockline itself got signal N ... while the command
/// ran"; "3 when the lock was lost while held". The lock is lost while the
/// command is being stopped after SIGTERM.
#[test]
fn lost_while_stopping_after_sigterm_exits_1() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let mut child = lockline(
        &cluster,
        &["--kill-after", "3", "att/stop-lost", "sh", "-c", "trap '' TERM; sleep 300"],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit())
    .spawn()
    .expect("spawn");
    let mut key = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut key)
        .expect("key");
    std::thread::sleep(Duration::from_millis(300));
    send(&child, libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(500));
    revoke(&cluster, key.trim());
    let status = wait(&mut child, Duration::from_secs(15));
    assert!(
        [Some(143), Some(3)].contains(&status.code()),
        "exit status {status:?}: neither 143 (SIGTERM) nor 3 (lost)"
    );
}

/// The command exits by itself (status 7) leaving a background job that
/// ignores SIGTERM; the lock is lost during the grace.
#[test]
fn lost_while_stopping_leftovers_exits_1() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let mut child = lockline(
        &cluster,
        &[
            "--kill-after",
            "3",
            "att/left-lost",
            "sh",
            "-c",
            "(trap '' TERM; sleep 300) & sleep 0.5; exit 7",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit())
    .spawn()
    .expect("spawn");
    let mut key = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut key)
        .expect("key");
    std::thread::sleep(Duration::from_millis(1500));
    revoke(&cluster, key.trim());
    let status = wait(&mut child, Duration::from_secs(15));
    assert!(
        [Some(7), Some(3)].contains(&status.code()),
        "exit status {status:?}: neither the command's 7 nor 3 (lost)"
    );
}

/// README: "the lock is lost: ... the group is signalled first, before
/// anything else". With lockline's stderr a closed pipe the first thing it
/// does on loss is write a diagnostic.
#[test]
fn lock_lost_with_a_closed_stderr_leaves_the_command_s_group_running() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let dir = tempfile::tempdir().expect("tempdir");
    let bg = dir.path().join("bg");
    let script = format!("sleep 300 & echo $! > {}; wait", bg.display());
    let mut child = lockline(&cluster, &["att/lost-stderr", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn lockline");
    let mut key = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut key)
        .expect("key");
    let mut holding = String::new();
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
    stderr.read_line(&mut holding).expect("holding line");
    drop(stderr);
    let bg = read_pid(&bg);
    revoke(&cluster, key.trim());
    let status = wait(&mut child, Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(500));
    let survived = running(bg);
    // SAFETY: kill(2) of a process this test started.
    unsafe { libc::kill(bg, libc::SIGKILL) };
    assert!(
        !survived,
        "lockline exited {status:?} after losing the lock while the command's background process still ran, \
         with nobody left to stop it"
    );
    assert_eq!(status.code(), Some(3));
}

/// README: "While lockline waits in line, SIGINT, SIGTERM, SIGHUP or SIGQUIT
/// cancel the wait: its entry is removed and its session closed before it
/// exits, so contenders queued behind it move up at once rather than after
/// its TTL." Here its stderr is a closed pipe.
#[test]
fn sigterm_while_waiting_with_a_closed_stderr_leaves_the_entry() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let mut holder = lockline(&cluster, &["att/wait-stderr"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("holder");
    let mut key = String::new();
    BufReader::new(holder.stdout.take().expect("stdout"))
        .read_line(&mut key)
        .expect("key");
    let mut waiter = lockline(&cluster, &["--ttl", "30", "att/wait-stderr", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("waiter");
    drop(waiter.stderr.take());
    let end = Instant::now() + Duration::from_secs(10);
    while keys(&cluster, "att/wait-stderr").len() < 2 {
        assert!(Instant::now() < end, "the waiter never queued");
        std::thread::sleep(Duration::from_millis(50));
    }
    send(&waiter, libc::SIGTERM);
    let status = wait(&mut waiter, Duration::from_secs(10));
    let left = keys(&cluster, "att/wait-stderr");
    send(&holder, libc::SIGTERM);
    let _ = wait(&mut holder, Duration::from_secs(10));
    assert!(
        left.len() == 1 && status.code() == Some(143),
        "a waiter signalled with SIGTERM exited {status:?} and left its entry: {left:?}"
    );
}

/// README: "`0` means SIGKILL at once". On a lost lock with `--kill-after 0`
/// the command should get no chance to act (its handler might write to the
/// resource the lock protected).
#[test]
fn kill_after_zero_still_runs_the_command_s_sigterm_handler_after_a_lost_lock() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let dir = tempfile::tempdir().expect("tempdir");
    let wrote = dir.path().join("wrote-after-loss");
    let ready = dir.path().join("ready");
    let script = format!(
        "trap 'echo wrote >> {}' TERM; echo $$ > {}; while :; do :; done",
        wrote.display(),
        ready.display()
    );
    let mut runs = 0;
    let mut handled = 0;
    for round in 0..3 {
        let name = format!("att/kill-zero-{round}");
        let mut child = lockline(&cluster, &["--kill-after", "0", &name, "sh", "-c", &script])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn");
        let mut key = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut key)
            .expect("key");
        let _ = read_pid(&ready);
        std::fs::remove_file(&ready).expect("rm");
        revoke(&cluster, key.trim());
        let status = wait(&mut child, Duration::from_secs(10));
        assert_eq!(status.code(), Some(3), "lost lock");
        runs += 1;
        if std::fs::read_to_string(&wrote).is_ok_and(|t| t.lines().count() > handled) {
            handled += 1;
        }
    }
    assert_eq!(
        handled, 0,
        "with --kill-after 0 the command's SIGTERM handler ran after the lock was lost in {handled} of {runs} runs"
    );
}
