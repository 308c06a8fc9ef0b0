//! The signals that ask `lockline` to stop: SIGINT, SIGTERM and SIGHUP.

use std::io;

use tokio::signal::unix::{signal, Signal, SignalKind};

/// Listens for SIGINT, SIGTERM and SIGHUP from the moment it is made: their
/// default action (dying on the spot, the lock and the command left behind)
/// no longer applies.
#[derive(Debug)]
pub(crate) struct StopSignals {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
}

impl StopSignals {
    pub(crate) fn listen() -> io::Result<Self> {
        Ok(StopSignals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
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
            // The runtime is shutting down: no signal will come.
            else => std::future::pending().await,
        }
    }
}
