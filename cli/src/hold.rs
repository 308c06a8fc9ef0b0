//! Holding a lock or a leadership, for `lock` and `elect` alike: waiting in
//! line (each takes its own way, `lock.rs` and `elect.rs`), the held key
//! printed, the command run in a process group of its own that dies with
//! the lock, and the release.

use std::ffi::OsStr;
use std::time::Duration;

use lockline::{Error, FencingToken, Leadership, MutexGuard, Permit, ReadGuard, ResourceGuard, Sequencer, Session};

use crate::args::{Args, Mode};
use crate::exit::{CANNOT_RUN, DEFAULT_CONFLICT, FAILURE, NOT_FOUND};
use crate::group::{self, signal_status, ProcessGroup};
use crate::lock::{self, Recipe};
use crate::signals::{signal_name, StopSignals, SuspendSignal};
use crate::{elect, output};

/// How long `lockline` tries to close the session of a lost lock.
const LOST_CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

/// How holding the lock ended.
pub(crate) enum Held {
    /// Released (or never taken); exit with this status.
    Released(u8),
    /// A signal came while waiting in line; the acquire was cancelled.
    Cancelled(libc::c_int),
    /// The lock was lost while held (while a process of the command's group
    /// still ran, when there was a command); the session is closed.
    Lost,
}

/// A held lock, read lock, permit, lock mode or leadership: the same guard
/// surface.
#[derive(Debug)]
pub(crate) enum Holding {
    Lock(MutexGuard),
    Read(ReadGuard),
    Permit(Permit),
    Mode(ResourceGuard),
    Leader(Leadership),
}

/// Each of [`Holding`]'s guards, for the same call.
macro_rules! each {
    ($holding:expr, $guard:ident => $body:expr) => {
        match $holding {
            Holding::Lock($guard) => $body,
            Holding::Read($guard) => $body,
            Holding::Permit($guard) => $body,
            Holding::Mode($guard) => $body,
            Holding::Leader($guard) => $body,
        }
    };
}

impl Holding {
    /// What is held, for messages.
    fn what(&self) -> &'static str {
        match self {
            Holding::Lock(_) => "lock",
            Holding::Read(_) => "shared lock",
            Holding::Permit(_) => "permit",
            Holding::Mode(_) => "lock",
            Holding::Leader(_) => "leadership",
        }
    }

    fn key(&self) -> &str {
        each!(self, guard => guard.key())
    }

    fn token(&self) -> FencingToken {
        each!(self, guard => guard.token())
    }

    fn sequencer(&self) -> Sequencer {
        each!(self, guard => guard.sequencer())
    }

    fn is_held(&self) -> bool {
        each!(self, guard => guard.is_held())
    }

    /// Resolves once the lock or leadership may no longer be held.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    async fn lost(&self) {
        each!(self, guard => guard.lost().await)
    }

    async fn release(self) -> lockline::Result<()> {
        match self {
            Holding::Lock(guard) => guard.release().await,
            Holding::Read(guard) => guard.release().await,
            Holding::Permit(guard) => guard.release().await,
            Holding::Mode(guard) => guard.release().await,
            Holding::Leader(leadership) => leadership.resign().await,
        }
    }
}

/// Waits in line for the lock, or campaigns, as `args` say; `None` when
/// `--nonblock` found the lock taken (no entry is left behind).
async fn acquire(args: &Args, session: &Session) -> lockline::Result<Option<Holding>> {
    match &args.mode {
        Mode::Elect { proposal, .. } => elect::campaign(args, session, proposal).await.map(Some),
        Mode::Lock { recipe, .. } => lock::acquire(args, session, *recipe).await,
        Mode::Listen | Mode::List | Mode::Check { .. } => lock::acquire(args, session, Recipe::Exclusive).await,
    }
}

/// Takes the lock (or leadership), then holds it without a command until a
/// signal, or while the command runs; releases it, and says how it ended.
pub(crate) async fn hold(args: &Args, session: &Session, signals: &mut StopSignals) -> lockline::Result<Held> {
    let held = tokio::select! {
        // A signal that is pending when the lock is granted still cancels the
        // wait: dropping the acquire removes the entry, granted or not.
        biased;
        signal = signals.recv() => {
            note!("lockline: got {} while waiting for {:?}; leaving the queue", signal_name(signal), args.name);
            return Ok(Held::Cancelled(signal));
        }
        held = acquire(args, session) => match held? {
            Some(held) => held,
            None => {
                let code = args.nonblock.unwrap_or(DEFAULT_CONFLICT);
                note!("lockline: {:?} is taken (--nonblock: one try); exit {code}", args.name);
                return Ok(Held::Released(code));
            }
        },
    };
    let command = args.command();
    // With a command, standard output is the command's alone, unless asked.
    if command.is_empty() || args.print_key {
        output::key(held.key());
    }
    note!("lockline: holding {} with fencing token {}", held.key(), held.token());
    let code = if command.is_empty() {
        tokio::select! {
            // A loss ready together with a signal counts as a loss.
            biased;
            () = held.lost() => {
                note!("lockline: {} lost", held.what());
                close_lost(session).await;
                return Ok(Held::Lost);
            }
            _ = signals.recv() => 0,
        }
    } else {
        match run_command(&held, session, command, args.kill_after, signals).await {
            Some(code) => code,
            None => return Ok(Held::Lost),
        }
    };
    let what = held.what();
    match held.release().await {
        Ok(()) => {}
        // Lost after the command's group was gone (or, without a command,
        // after the signal): nothing ran without the lock, and there is
        // nothing left to release.
        Err(error @ (Error::SessionLost { .. } | Error::LockLost { .. })) => {
            note!("lockline: the {what} was lost once the command was gone; nothing to release: {error}");
        }
        // A failed release is lockline's own failure (125) whatever the
        // cause, an unreachable cluster included: the command ran with the
        // lock held all along.
        Err(error) => {
            note!(
                "lockline: could not release the {what}: {error}; the server frees it when the session's TTL runs out"
            );
            return Ok(Held::Released(FAILURE));
        }
    }
    Ok(Held::Released(code))
}

/// Closes the session of a lost lock. The server may be out of reach:
/// closing is a courtesy here and must not hold up the exit.
pub(crate) async fn close_lost(session: &Session) {
    let _ = tokio::time::timeout(LOST_CLOSE_TIMEOUT, session.close()).await;
}

/// The next SIGTSTP, when `lockline` listens for it.
async fn suspended(suspend: &mut Option<SuspendSignal>) {
    match suspend {
        Some(suspend) => suspend.recv().await,
        None => std::future::pending().await,
    }
}

/// Runs the command in its own process group and returns the status to exit
/// with once no process of the group runs any more, or `None` when the lock
/// was lost before that (the session is then closed).
async fn run_command(
    guard: &Holding,
    session: &Session,
    command: &[String],
    kill_after: Duration,
    signals: &mut StopSignals,
) -> Option<u8> {
    let Some((program, arguments)) = command.split_first() else {
        return Some(0);
    };
    let token = guard.token().to_string();
    let sequencer = guard.sequencer().to_string();
    let env = [
        ("LOCKLINE_KEY", OsStr::new(guard.key())),
        ("LOCKLINE_TOKEN", OsStr::new(&token)),
        ("LOCKLINE_SEQUENCER", OsStr::new(&sequencer)),
    ];
    // Listen before the command exists, so that a Ctrl-Z right after it
    // starts is not lockline's default stop, which would leave it running.
    let mut suspend = match SuspendSignal::listen() {
        Ok(suspend) => Some(suspend),
        Err(error) => {
            note!("lockline: cannot listen for SIGTSTP; Ctrl-Z will not pause the command: {error}");
            None
        }
    };
    if !guard.is_held() {
        note!(
            "lockline: {} lost before the command started; not running it",
            guard.what()
        );
        close_lost(session).await;
        return None;
    }
    let mut group = match ProcessGroup::spawn(program, arguments, env) {
        Ok(group) => group,
        Err(error) => {
            note!("lockline: cannot run {program:?}: {error}");
            return Some(match error.kind() {
                std::io::ErrorKind::NotFound => NOT_FOUND,
                _ => CANNOT_RUN,
            });
        }
    };
    /// Why the command's group is stopped.
    enum Cause {
        Ended(group::Ended),
        Signal(libc::c_int),
        Lost,
    }
    let cause = loop {
        tokio::select! {
            // When several are ready at once, the loss wins (lockline cannot
            // tell whether the command still ran without the lock), then a
            // signal to lockline, then the command's exit.
            biased;
            () = guard.lost() => break Cause::Lost,
            signal = signals.recv() => break Cause::Signal(signal),
            ended = group.wait() => break Cause::Ended(ended),
            () = suspended(&mut suspend) => group.pause_with_lockline(),
        }
    };
    // The group is signalled first, before anything else: on a lost lock
    // someone else may hold it already.
    let stopping = group.start_stop(kill_after);
    // A second signal while the group is being stopped sends SIGKILL at once.
    let hurry = async {
        signals.recv().await;
    };
    let code = match cause {
        Cause::Lost => {
            note!("lockline: {} lost; stopping the command", guard.what());
            tokio::join!(group.finish_stop(stopping, hurry), close_lost(session));
            return None;
        }
        Cause::Signal(signal) => {
            note!(
                "lockline: got {}; the lock is released once the command is gone",
                signal_name(signal)
            );
            signal_status(signal)
        }
        // What the command left running in its group does not outlive the
        // lock either.
        Cause::Ended(ended) => ended.code(),
    };
    // The lock may still be lost while the group is being stopped: a process
    // of the command then runs without it, and that is what `lockline`
    // reports (3), whatever started the stop. The group's SIGTERM was sent
    // already; its SIGKILL comes when the grace ends, as on any lost lock.
    let finishing = group.finish_stop(stopping, hurry);
    tokio::pin!(finishing);
    tokio::select! {
        // Both ready: the loss wins, as above.
        biased;
        () = guard.lost() => {
            note!("lockline: {} lost while the command's group was being stopped", guard.what());
            tokio::join!(finishing, close_lost(session));
            None
        }
        () = &mut finishing => Some(code),
    }
}
