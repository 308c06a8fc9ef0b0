//! The command run under a lock, in a process group of its own, so that it can
//! be stopped as a whole: SIGTERM to the group, then SIGKILL after a grace.
//!
//! `lockline` reaps its own children: it has no child other than the command
//! (the etcd and ZooKeeper clients start no process), it is made a *child
//! subreaper* so that orphaned members of the group are re-parented to it
//! rather than to init, and it collects every exited child with
//! `waitpid(-1, WNOHANG)` on each SIGCHLD.

use std::ffi::OsStr;
use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::time::Instant;

/// How often the group is looked at again while it is being stopped, besides
/// each SIGCHLD. A member whose parent is alive but outside the group (it left
/// with `setsid`) exits without a SIGCHLD to `lockline`, and the kernel has no
/// event for "this process group is now empty".
const RECHECK: Duration = Duration::from_millis(50);

/// How a process ended, as `waitpid` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    /// It exited with this status.
    Exited(u8),
    /// It was killed by this signal.
    Signalled(libc::c_int),
}

impl Ended {
    fn from_wait_status(status: libc::c_int) -> Self {
        if libc::WIFSIGNALED(status) {
            Ended::Signalled(libc::WTERMSIG(status))
        } else {
            // WEXITSTATUS is the low 8 bits of the exit code.
            Ended::Exited(u8::try_from(libc::WEXITSTATUS(status) & 0xff).unwrap_or(u8::MAX))
        }
    }

    /// The status a shell would report: the exit status, or 128 + the signal.
    pub(crate) fn code(self) -> u8 {
        match self {
            Ended::Exited(code) => code,
            Ended::Signalled(signal) => signal_status(signal),
        }
    }
}

/// 128 + `signal`, the status shells give to a process killed by a signal.
pub(crate) fn signal_status(signal: libc::c_int) -> u8 {
    u8::try_from(128 + signal).unwrap_or(u8::MAX)
}

/// A stop begun by [`ProcessGroup::start_stop`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stopping {
    /// When SIGKILL follows SIGTERM.
    deadline: Instant,
    /// Whether SIGKILL was already sent.
    killed: bool,
}

/// The running command: the leader of its own process group.
#[derive(Debug)]
pub(crate) struct ProcessGroup {
    /// The command's pid, which is also the group's id.
    leader: libc::pid_t,
    /// Set once the command itself has been reaped.
    ended: Option<Ended>,
    child_exited: Signal,
}

impl ProcessGroup {
    /// Starts `program` with `args` and `env` added to `lockline`'s
    /// environment, as the leader of a new process group, with
    /// `PR_SET_PDEATHSIG` = SIGKILL (on Linux) so that it dies with `lockline`.
    ///
    /// Must be called from the thread that runs `main` (the runtime's
    /// `block_on`), never from a spawned task: the parent-death signal fires
    /// when the *thread* that forked the child ends.
    pub(crate) fn spawn<'a>(
        program: &str,
        args: &[String],
        env: impl IntoIterator<Item = (&'a str, &'a OsStr)>,
    ) -> io::Result<Self> {
        // Listen before the child exists so that no SIGCHLD is missed.
        let child_exited = signal(SignalKind::child())?;
        become_subreaper();
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        let mut command = Command::new(program);
        command.args(args).envs(env).process_group(0);
        // SAFETY: the closure runs between fork and exec and calls only
        // async-signal-safe functions (prctl, getppid); it allocates nothing.
        unsafe {
            command.pre_exec(move || die_with_parent(parent));
        }
        // `spawn` returns once the child has exec'd, so its group exists.
        let child = command.spawn()?;
        let leader = libc::pid_t::try_from(child.id()).map_err(io::Error::other)?;
        // Dropping a std `Child` neither waits for nor kills it; `reap` does.
        drop(child);
        Ok(ProcessGroup {
            leader,
            ended: None,
            child_exited,
        })
    }

    /// Waits for the command itself (the group's leader) to end; other members
    /// of its group may still run.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a status reaped meanwhile is kept for the next call.
    pub(crate) async fn wait(&mut self) -> Ended {
        loop {
            self.reap();
            if let Some(ended) = self.ended {
                return ended;
            }
            if self.child_exited.recv().await.is_none() {
                // The runtime is shutting down; nothing more will be heard.
                std::future::pending::<()>().await;
            }
        }
    }

    /// Starts stopping every process of the group, at once and before
    /// anything else: SIGKILL when `grace` is zero, otherwise SIGTERM (and
    /// SIGCONT, so that a stopped member sees it). Finish with
    /// [`finish_stop`](Self::finish_stop).
    pub(crate) fn start_stop(&mut self, grace: Duration) -> Stopping {
        let deadline = Instant::now() + grace;
        self.reap();
        if !self.alive(false) {
            return Stopping {
                deadline,
                killed: false,
            };
        }
        if grace.is_zero() {
            // No SIGTERM first: with no grace, a handler of the command must
            // not get to run (the lock may already be lost).
            self.signal(libc::SIGKILL);
            note!("lockline: sent SIGKILL to process group {}", self.leader);
            return Stopping { deadline, killed: true };
        }
        self.signal(libc::SIGTERM);
        self.signal(libc::SIGCONT);
        note!("lockline: sent SIGTERM to process group {}", self.leader);
        Stopping {
            deadline,
            killed: false,
        }
    }

    /// Finishes what [`start_stop`](Self::start_stop) began: SIGKILL to the
    /// group once its grace has passed or `hurry` resolves (a second signal
    /// to `lockline`), and returns once no member of the group runs.
    ///
    /// # Cancel safety
    ///
    /// Not meant to be cancelled: the group may then still run.
    pub(crate) async fn finish_stop(&mut self, stopping: Stopping, hurry: impl std::future::Future<Output = ()>) {
        if !stopping.killed {
            tokio::pin!(hurry);
            loop {
                self.reap();
                if !self.alive(false) {
                    return;
                }
                tokio::select! {
                    _ = self.child_exited.recv() => {}
                    () = tokio::time::sleep(RECHECK) => {}
                    () = tokio::time::sleep_until(stopping.deadline) => break,
                    () = &mut hurry => break,
                }
            }
            self.reap();
            if !self.alive(false) {
                return;
            }
            self.signal(libc::SIGKILL);
            note!(
                "lockline: process group {} still ran after SIGTERM; sent SIGKILL",
                self.leader
            );
        }
        loop {
            self.reap();
            if !self.alive(true) {
                return;
            }
            tokio::select! {
                _ = self.child_exited.recv() => {}
                () = tokio::time::sleep(RECHECK) => {}
            }
        }
    }

    /// Pauses the group (SIGSTOP) and `lockline` itself, as Ctrl-Z would
    /// pause a job; once `lockline` is continued (SIGCONT, `fg`), continues
    /// the group.
    ///
    /// While paused `lockline` renews nothing, so the lock may be lost; the
    /// command, paused too, does no unprotected work meanwhile, and is stopped
    /// as on any lost lock once `lockline` runs again.
    pub(crate) fn pause_with_lockline(&mut self) {
        self.reap();
        let alive = self.alive(false);
        if alive {
            self.signal(libc::SIGSTOP);
        }
        // SAFETY: raise(3) has no preconditions; SIGSTOP stops every thread of
        // the process, and the call returns once the process is continued.
        unsafe { libc::raise(libc::SIGSTOP) };
        self.reap();
        if alive && self.alive(false) {
            self.signal(libc::SIGCONT);
        }
    }

    /// Collects every child that has ended (the command and orphans of its
    /// group re-parented to `lockline`), keeping the command's status.
    fn reap(&mut self) {
        loop {
            let mut status: libc::c_int = 0;
            // SAFETY: waitpid writes only to `status`.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid > 0 {
                if pid == self.leader {
                    self.ended = Some(Ended::from_wait_status(status));
                }
                continue;
            }
            if pid < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            // 0: children remain but none has ended; ECHILD: no child left.
            return;
        }
    }

    /// Sends `signal` to every member of the group.
    ///
    /// Only called right after [`alive`](Self::alive) said the group exists:
    /// a group id is not reused while any process is in the group.
    fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) with a negative pid signals a process group.
        if unsafe { libc::kill(-self.leader, signal) } != 0 {
            let error = io::Error::last_os_error();
            if error.raw_os_error() != Some(libc::ESRCH) {
                note!(
                    "lockline: cannot send signal {signal} to process group {}: {error}",
                    self.leader
                );
            }
        }
    }

    /// Whether a process of the group may still run.
    ///
    /// The kernel counts zombies as members. Those `lockline` can reap are
    /// reaped before this is asked; after SIGKILL, a group left with only
    /// zombies whose parent lives outside the group counts as gone (read from
    /// `/proc`). Before SIGKILL such a group counts as alive, which costs at
    /// most the grace.
    fn alive(&self, killed: bool) -> bool {
        // SAFETY: signal 0 only checks that the group exists.
        if unsafe { libc::kill(-self.leader, 0) } != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
        {
            return false;
        }
        if killed {
            return has_running_member(self.leader).unwrap_or(true);
        }
        true
    }
}

/// Makes orphaned members of the group come to `lockline` rather than to
/// init (which may not reap them in a container). Best effort: the liveness
/// check does not depend on it.
#[cfg(target_os = "linux")]
fn become_subreaper() {
    // SAFETY: prctl with integer arguments only.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0);
    }
}

#[cfg(not(target_os = "linux"))]
fn become_subreaper() {}

/// In the child, between fork and exec: SIGKILL when `parent` dies
/// (`PR_SET_PDEATHSIG`), and refuse to start when it already has.
/// Async-signal-safe, as code between fork and exec must be: system calls
/// only, no allocation.
#[cfg(target_os = "linux")]
fn die_with_parent(parent: libc::pid_t) -> io::Result<()> {
    // SAFETY: prctl and getppid with integer arguments only.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        // `lockline` may have died before prctl took effect: then no signal
        // will come, and the command must not run unsupervised.
        if libc::getppid() != parent {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
    }
    Ok(())
}

/// Without `PR_SET_PDEATHSIG` (not Linux) the command does not die with a
/// SIGKILLed `lockline`.
#[cfg(not(target_os = "linux"))]
fn die_with_parent(_parent: libc::pid_t) -> io::Result<()> {
    Ok(())
}

/// Whether `/proc` shows a process of group `group` that is not a zombie;
/// `None` when `/proc` cannot be read.
fn has_running_member(group: libc::pid_t) -> Option<bool> {
    for entry in std::fs::read_dir("/proc").ok()? {
        let Ok(entry) = entry else { continue };
        let file_name = entry.file_name();
        let Some(pid) = file_name.to_str() else { continue };
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        // A process that ended meanwhile has no stat file: skip it.
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid pgrp ...": comm may hold spaces and parens.
        let Some((_, after)) = stat.rsplit_once(')') else {
            continue;
        };
        let mut fields = after.split_whitespace();
        let (Some(state), Some(_ppid), Some(pgrp)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        if pgrp.parse::<libc::pid_t>() == Ok(group) && !matches!(state, "Z" | "X" | "x") {
            return Some(true);
        }
    }
    Some(false)
}

#[cfg(test)]
mod tests {
    use super::{signal_status, Ended};

    #[test]
    fn statuses_are_those_a_shell_reports() {
        assert_eq!(Ended::Exited(7).code(), 7);
        assert_eq!(Ended::Signalled(libc::SIGKILL).code(), 137);
        assert_eq!(signal_status(libc::SIGINT), 130);
        assert_eq!(signal_status(libc::SIGTERM), 143);
        assert_eq!(Ended::from_wait_status(3 << 8), Ended::Exited(3));
        assert_eq!(Ended::from_wait_status(libc::SIGKILL), Ended::Signalled(libc::SIGKILL));
    }
}
