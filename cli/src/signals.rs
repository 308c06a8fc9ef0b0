//! The signals that ask `lockline` to stop (SIGINT, SIGTERM, SIGHUP,
//! SIGQUIT) or to pause (SIGTSTP).

use std::io;

use tokio::signal::unix::{signal, Signal, SignalKind};

/// Listens for SIGINT, SIGTERM, SIGHUP and SIGQUIT from the moment it is
/// made: their default action (dying on the spot, the lock and the command
/// left behind) no longer applies.
#[derive(Debug)]
pub(crate) struct StopSignals {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
    quit: Signal,
}

impl StopSignals {
    pub(crate) fn listen() -> io::Result<Self> {
        Ok(StopSignals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
            quit: signal(SignalKind::quit())?,
        })
    }

    /// The next stop signal's number.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a signal that arrives meanwhile is seen by the next call.
    pub(crate) async fn recv(&mut self) -> libc::c_int {
        tokio::select! {
            Some(()) = self.interrupt.recv() => libc::SIGINT,
            Some(()) = self.terminate.recv() => libc::SIGTERM,
            Some(()) = self.hangup.recv() => libc::SIGHUP,
            Some(()) = self.quit.recv() => libc::SIGQUIT,
            // The runtime is shutting down: no signal will come.
            else => std::future::pending().await,
        }
    }
}

/// Listens for SIGTSTP (Ctrl-Z) while a command runs: `lockline` then pauses
/// the command's group along with itself, rather than stopping alone while
/// the command runs on unsupervised.
#[derive(Debug)]
pub(crate) struct SuspendSignal(Signal);

impl SuspendSignal {
    pub(crate) fn listen() -> io::Result<Self> {
        Ok(SuspendSignal(signal(SignalKind::from_raw(libc::SIGTSTP))?))
    }

    /// Resolves on the next SIGTSTP.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub(crate) async fn recv(&mut self) {
        if self.0.recv().await.is_none() {
            std::future::pending::<()>().await;
        }
    }
}

/// The usual name of a signal `lockline` handles, for messages.
pub(crate) fn signal_name(signal: libc::c_int) -> String {
    match signal {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGHUP => "SIGHUP".into(),
        libc::SIGQUIT => "SIGQUIT".into(),
        other => format!("signal {other}"),
    }
}
