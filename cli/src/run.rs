//! Running what the command line asks for: the runtime, the signals that
//! stop `lockline`, the backend and its session, the subcommand, and the
//! exit status of how it went.

use std::time::Duration;

use lockline::{Error, SessionOptions};

use crate::args::{Args, Mode};
use crate::exit::{failure_status, FAILURE, LOST, TIMED_OUT};
use crate::group::signal_status;
use crate::hold::{self, Held};
use crate::signals::StopSignals;
use crate::{backend, check, elect, list, metrics};

/// How long a `lockline` signalled while waiting waits for its entry to be
/// removed before it closes the session anyway.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Starts the runtime on this thread (the command must be spawned from the
/// thread that runs `main`, see [`ProcessGroup::spawn`]) and runs.
///
/// [`ProcessGroup::spawn`]: crate::group::ProcessGroup::spawn
pub(crate) fn start(args: Args) -> u8 {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            note!("lockline: cannot start the async runtime: {error}");
            return FAILURE;
        }
    };
    runtime.block_on(async {
        // From here on SIGINT, SIGTERM, SIGHUP and SIGQUIT no longer kill
        // `lockline` on the spot: each step below decides what they mean.
        let mut signals = match StopSignals::listen() {
            Ok(signals) => signals,
            Err(error) => {
                note!("lockline: cannot listen for SIGINT, SIGTERM, SIGHUP and SIGQUIT: {error}");
                return FAILURE;
            }
        };
        match run(args, &mut signals).await {
            Ok(code) => code,
            Err(Error::Timeout { name, waited, .. }) => {
                if waited.is_zero() {
                    note!("lockline: {name:?} is taken (--timeout 0: one try)");
                } else {
                    note!("lockline: {name:?} not acquired within {waited:?}");
                }
                TIMED_OUT
            }
            Err(error) => {
                let message = error.to_string();
                note!("lockline: {message}");
                // The message already holds its causes' words; a cause it
                // does not hold gets a line of its own.
                let mut source = std::error::Error::source(&error);
                while let Some(cause) = source {
                    let words = cause.to_string();
                    if !message.contains(&words) {
                        note!("  caused by: {words}");
                    }
                    source = cause.source();
                }
                failure_status(&error)
            }
        }
    })
}

/// Opens a session on the backend the arguments name, does what they ask
/// for, and closes it; the status to exit with.
async fn run(args: Args, signals: &mut StopSignals) -> lockline::Result<u8> {
    let client = backend::client(&args)?;
    if let Some(addr) = args.metrics {
        metrics::serve(addr)?;
    }
    if let Mode::Check { sequencer } = &args.mode {
        // No lock can have this name: refused before anything is contacted.
        client.validate_name(sequencer.name())?;
    }
    let options = SessionOptions::new()
        .with_ttl(args.ttl)
        .with_lock_delay(args.lock_delay);
    let session = tokio::select! {
        biased;
        // Nothing is queued yet; a session being opened ends with its TTL.
        signal = signals.recv() => return Ok(signal_status(signal)),
        session = client.session_with(options) => session?,
    };
    let outcome = match &args.mode {
        Mode::Lock { .. } | Mode::Elect { .. } => hold::hold(&args, &session, signals).await,
        Mode::Listen => elect::listen(&args, &session, signals).await,
        Mode::List => list::list(&args, &session, signals).await,
        // Through this session, closed below: nothing of it stays behind.
        Mode::Check { sequencer } => check::check(&args, &session, sequencer, signals)
            .await
            .map(Held::Released),
    };
    match outcome {
        Ok(Held::Released(code)) => {
            // The lock is released (or was lost only once nothing of the
            // command ran): a session that cannot be closed cleanly ends with
            // its TTL and holds nothing, so it does not change the status.
            if let Err(error) = session.close().await {
                note!("lockline: closing the session was not confirmed; it ends when its TTL runs out: {error}");
            }
            Ok(code)
        }
        Ok(Held::Cancelled(signal)) => {
            // The acquire was dropped, which removes its entry in the
            // session's background: wait for that (a second signal cuts it
            // short), then close the session, which removes whatever is left
            // on the server now rather than when its TTL runs out.
            let flushed = tokio::select! {
                biased;
                _ = signals.recv() => false,
                flushed = tokio::time::timeout(CLEANUP_TIMEOUT, session.flush()) => flushed.is_ok(),
            };
            let closed = session.close().await;
            if !flushed || closed.is_err() {
                let reason = closed.err().map(|e| format!(": {e}")).unwrap_or_default();
                note!(
                    "lockline: leaving the queue of {:?} was not confirmed; its entry goes when the session's TTL runs out{reason}",
                    args.name
                );
            }
            Ok(signal_status(signal))
        }
        // The session was closed while the command's group was stopped.
        Ok(Held::Lost) => Ok(LOST),
        Err(error) => {
            let _ = session.close().await;
            Err(error)
        }
    }
}
