//! `lockline lock NAME COMMAND` when its output cannot be written, when the
//! lock is lost while the command's group is being stopped, and with
//! `--kill-after 0`: the group is stopped and the entry removed whatever
//! happens to the output, and the exit status is the documented one. Real
//! etcd; std processes (no async process plumbing needed).

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

/// On SIGTERM the lock is released only once no process of the command's
/// group runs, even when lockline's stderr is a pipe whose reader has gone (a
/// log shipper that died, `2>&1 | head`) so that its diagnostics fail: the
/// background process is gone when lockline exits 143, and the next holder
/// never overlaps with it.
#[test]
fn sigterm_with_a_closed_stderr_stops_the_group_and_exits_143() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let dir = tempfile::tempdir().expect("tempdir");
    let bg = dir.path().join("bg");
    let script = format!("sleep 300 & echo $! > {}; wait", bg.display());
    let mut child = lockline(&cluster, &["--ttl", "2", "out/stderr", "sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn lockline");
    // With a command the held key is on stderr only.
    let mut holding = String::new();
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
    stderr.read_line(&mut holding).expect("holding line");
    assert!(holding.starts_with("lockline: holding out/stderr/"), "{holding}");
    drop(stderr); // the reader of lockline's stderr goes away
    let bg = read_pid(&bg);
    send(&child, libc::SIGTERM);
    let status = wait(&mut child, Duration::from_secs(10));
    let survived = running(bg);
    // The lock is freed by the server after the TTL; the next holder is granted
    // while the first command's process may still run.
    let next = lockline(&cluster, &["--timeout", "10", "out/stderr", "true"])
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

/// An unwritable stdout (here /dev/full) when lockline prints the held key
/// (`--print-key`): no panic, the failure is reported on stderr, the command
/// still runs, its status (0) is lockline's, and the key is released.
#[test]
fn an_unwritable_stdout_still_runs_the_command_and_releases() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let out = lockline(&cluster, &["--ttl", "10", "--print-key", "out/full", "true"])
        .stdout(full)
        .stderr(Stdio::piped())
        .output()
        .expect("lockline");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let left = keys(&cluster, "out/full");
    assert!(
        !stderr.contains("panicked") && out.status.code() == Some(0) && left.is_empty(),
        "status {:?}, keys left {left:?}, stderr: {stderr}",
        out.status
    );
    assert!(
        stderr.contains("cannot print the held key"),
        "the failed write of the key was not reported: {stderr}"
    );
}

/// The lock is lost while the command's group (which ignores SIGTERM) is
/// being stopped after SIGTERM to lockline: a process of the command ran
/// without the lock, so lockline exits 120, not 143 (and not 125).
#[test]
fn a_lock_lost_while_stopping_after_sigterm_exits_120() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let dir = tempfile::tempdir().expect("tempdir");
    let (started, termed) = (dir.path().join("started"), dir.path().join("termed"));
    // The shell notes SIGTERM and runs on (its `sleep`s die of it); only
    // SIGKILL, after the 3 s grace, ends it.
    let script = format!(
        "trap 'echo $$ > {}' TERM; echo $$ > {}; while :; do sleep 1; done",
        termed.display(),
        started.display()
    );
    let mut child = lockline(
        &cluster,
        &["--kill-after", "3", "--print-key", "out/stop-lost", "sh", "-c", &script],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit())
    .spawn()
    .expect("spawn");
    let mut key = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut key)
        .expect("key");
    read_pid(&started);
    send(&child, libc::SIGTERM);
    // lockline is stopping the group: the command has had its SIGTERM.
    read_pid(&termed);
    revoke(&cluster, key.trim());
    let status = wait(&mut child, Duration::from_secs(15));
    assert_eq!(
        status.code(),
        Some(120),
        "exit status {status:?}: the lock was lost while the command still ran"
    );
}

/// The command exits by itself (status 7) leaving a background job that
/// ignores SIGTERM; the lock is lost during the grace, while that job still
/// runs: lockline exits 120, not the command's 7 (and not 125).
#[test]
fn a_lock_lost_while_stopping_leftovers_exits_120() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let dir = tempfile::tempdir().expect("tempdir");
    let termed = dir.path().join("termed");
    // The background job notes SIGTERM and runs on until SIGKILL.
    let script = format!(
        "(trap 'echo $$ > {}' TERM; while :; do sleep 1; done) & sleep 0.5; exit 7",
        termed.display()
    );
    let mut child = lockline(
        &cluster,
        &["--kill-after", "3", "--print-key", "out/left-lost", "sh", "-c", &script],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit())
    .spawn()
    .expect("spawn");
    let mut key = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut key)
        .expect("key");
    // The command has exited and lockline is stopping what it left behind.
    read_pid(&termed);
    revoke(&cluster, key.trim());
    let status = wait(&mut child, Duration::from_secs(15));
    assert_eq!(
        status.code(),
        Some(120),
        "exit status {status:?}: the lock was lost while the command's background job still ran"
    );
}

/// A lost lock stops the command's group, and lockline exits 120, even when
/// its stderr is a closed pipe and every diagnostic it writes fails.
#[test]
fn a_lost_lock_with_a_closed_stderr_stops_the_group_and_exits_120() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let dir = tempfile::tempdir().expect("tempdir");
    let bg = dir.path().join("bg");
    let script = format!("sleep 300 & echo $! > {}; wait", bg.display());
    let mut child = lockline(&cluster, &["--print-key", "out/lost-stderr", "sh", "-c", &script])
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
    // lockline returns only once no member of the group still runs.
    let survived = running(bg);
    // SAFETY: kill(2) of a process this test started.
    unsafe { libc::kill(bg, libc::SIGKILL) };
    assert!(
        !survived,
        "lockline exited {status:?} after losing the lock while the command's background process still ran, \
         with nobody left to stop it"
    );
    assert_eq!(status.code(), Some(120));
}

/// SIGTERM while lockline waits in line removes its entry before it exits
/// 143 (not after its 30 s TTL), even when its stderr is a closed pipe.
#[test]
fn sigterm_while_waiting_with_a_closed_stderr_removes_the_entry() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let mut holder = lockline(&cluster, &["out/wait-stderr"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("holder");
    let mut key = String::new();
    BufReader::new(holder.stdout.take().expect("stdout"))
        .read_line(&mut key)
        .expect("key");
    let mut waiter = lockline(&cluster, &["--ttl", "30", "out/wait-stderr", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("waiter");
    drop(waiter.stderr.take());
    let end = Instant::now() + Duration::from_secs(10);
    while keys(&cluster, "out/wait-stderr").len() < 2 {
        assert!(Instant::now() < end, "the waiter never queued");
        std::thread::sleep(Duration::from_millis(50));
    }
    send(&waiter, libc::SIGTERM);
    let status = wait(&mut waiter, Duration::from_secs(10));
    let left = keys(&cluster, "out/wait-stderr");
    send(&holder, libc::SIGTERM);
    let _ = wait(&mut holder, Duration::from_secs(10));
    assert!(
        left.len() == 1 && status.code() == Some(143),
        "a waiter signalled with SIGTERM exited {status:?} and left its entry: {left:?}"
    );
}

/// `--kill-after 0` sends SIGKILL at once, with no SIGTERM first: on a lost
/// lock the command's SIGTERM handler (which might write to the resource the
/// lock protected) never runs. Three rounds, since a SIGTERM sent before the
/// SIGKILL would be handled only sometimes.
#[test]
fn kill_after_zero_sends_sigkill_without_sigterm() {
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
        let name = format!("out/kill-zero-{round}");
        let mut child = lockline(
            &cluster,
            &["--kill-after", "0", "--print-key", &name, "sh", "-c", &script],
        )
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
        assert_eq!(status.code(), Some(120), "lost lock");
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

/// A pipe that is full and never read: whoever writes to it blocks.
fn stalled_pipe() -> (std::io::PipeReader, std::io::PipeWriter) {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let (reader, mut writer) = std::io::pipe().expect("pipe");
    let fd = writer.as_raw_fd();
    // SAFETY: fcntl on a descriptor this test owns.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    assert!(flags >= 0);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) }, 0);
    let block = [b'x'; 4096];
    loop {
        match writer.write(&block) {
            Ok(_) => {}
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(error) => panic!("filling the pipe: {error}"),
        }
    }
    // SAFETY: as above; lockline gets a blocking descriptor, as a real pipe.
    assert_eq!(unsafe { libc::fcntl(fd, libc::F_SETFL, flags) }, 0);
    (reader, writer)
}

/// lockline's stderr is a pipe that is full and never read (a stalled log
/// reader): every write to it would block. A lost lock still stops the
/// command's group, and lockline exits 120 within seconds: neither the stop nor
/// the exit waits on its output.
#[test]
fn a_stalled_stderr_does_not_hold_up_stopping_the_group() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let dir = tempfile::tempdir().expect("tempdir");
    let bg = dir.path().join("bg");
    let script = format!("sleep 300 & echo $! > {}; wait", bg.display());
    let (_unread, stalled) = stalled_pipe();
    let mut child = lockline(&cluster, &["--print-key", "out/stalled-stderr", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(stalled)
        .spawn()
        .expect("spawn lockline");
    let mut key = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut key)
        .expect("key");
    let bg = read_pid(&bg);
    let revoked = Instant::now();
    revoke(&cluster, key.trim());
    let status = wait(&mut child, Duration::from_secs(10));
    let took = revoked.elapsed();
    let survived = running(bg);
    // SAFETY: kill(2) of a process this test started.
    unsafe { libc::kill(bg, libc::SIGKILL) };
    assert!(
        !survived,
        "lockline exited {status:?} after losing the lock while the command's background process still ran"
    );
    assert_eq!(status.code(), Some(120), "{status:?}");
    assert!(took < Duration::from_secs(5), "took {took:?} to exit after the loss");
}
