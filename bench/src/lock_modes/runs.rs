//! Driving the workloads: N contenders on the mutex, on a resource in EX,
//! and in the mixed workload, each for a window, with zero hold time; and
//! one N's three measurements ([`measure`]).

use std::sync::Arc;
use std::time::Duration;

use lockline::{Client, Error, LockMode, SessionOptions};

use crate::contenders::{Contenders, SESSION_TTL};
use crate::contest::{Contest, Outcome, Sampling};
use crate::BoxResult;

use super::counters::{counted, ServerCounters};
use super::mixed::MixedCounts;
use super::resources::ResourceContenders;
use super::{Figures, ModesArgs, Row};

/// How long after its window a measurement may take to stop (every
/// contender granted once more and released) before it is reported as
/// stalled.
const STALL: Duration = Duration::from_secs(60);

/// Runs `contest` for its window of `seconds`, then stops it.
async fn run_window(mut contest: Contest, seconds: f64) -> BoxResult<Outcome> {
    contest.run_for(seconds).await;
    stop(contest).await
}

/// Stops `contest`, or says it stalled.
async fn stop(contest: Contest) -> BoxResult<Outcome> {
    match tokio::time::timeout(STALL, contest.stop()).await {
        Ok(outcome) => outcome,
        Err(_) => Err(format!(
            "stalled: contenders not all stopped {} s after the window",
            STALL.as_secs()
        )
        .into()),
    }
}

/// lockline's mutex: N contenders, zero hold time, for `seconds`.
///
/// # Errors
///
/// A session that cannot be opened, a lock or release that fails, or a
/// measurement that stalls.
pub async fn mutex_run(n: usize, seconds: f64, name: &str, client: &mut dyn FnMut() -> Client) -> BoxResult<Figures> {
    let contenders = Contenders::open(n, name, client).await?;
    let outcome = run_window(contenders.contest(Sampling::Window), seconds).await?;
    let wakeups_per_release = contenders.wakeups_per_release();
    contenders.close().await?;
    Ok(Figures::of_handoffs(outcome, wakeups_per_release))
}

/// A resource locked in EX: N contenders, zero hold time, for `seconds`.
///
/// # Errors
///
/// As [`mutex_run`].
pub async fn ex_run(n: usize, seconds: f64, name: &str, client: &mut dyn FnMut() -> Client) -> BoxResult<Figures> {
    let contenders = ResourceContenders::open(n, name, client).await?;
    let outcome = run_window(contenders.ex_contest(), seconds).await?;
    let wakeups_per_release = contenders.wakeups_per_release();
    contenders.close().await?;
    Ok(Figures::of_handoffs(outcome, wakeups_per_release))
}

/// The mixed workload: N contenders, zero hold time, for `seconds`, their
/// modes drawn from `seed` (see the module docs).
///
/// # Errors
///
/// As [`mutex_run`]; a deadlock refused to an up-conversion is counted, not
/// an error.
pub async fn mixed_run(
    n: usize,
    seconds: f64,
    name: &str,
    seed: u64,
    client: &mut dyn FnMut() -> Client,
) -> BoxResult<Figures> {
    let contenders = ResourceContenders::open(n, name, client).await?;
    let counts = Arc::new(MixedCounts::default());
    let mut contest = contenders.mixed_contest(seed, &counts);
    contest.run_for(seconds).await;
    let (conversions, deadlocks) = counts.conversions_and_deadlocks();
    let outcome = stop(contest).await?;
    let wakeups_per_release = contenders.wakeups_per_release();
    contenders.close().await?;
    Ok(Figures {
        outcome,
        wakeups_per_release,
        conversions,
        deadlocks,
        overlaps: counts.overlaps(),
        server: Vec::new(),
    })
}

/// Whether this backend locks resources: one `try_lock` in NL on a fresh
/// session. `Ok(Some(why))` when it does not ([`Error::Unsupported`]).
///
/// # Errors
///
/// Any other failure.
pub async fn unsupported(name: &str, client: &mut dyn FnMut() -> Client) -> BoxResult<Option<String>> {
    let session = client()
        .session_with(SessionOptions::new().with_ttl(SESSION_TTL))
        .await?;
    let outcome = session.resource(name)?.try_lock(LockMode::Nl).await;
    let why = match outcome {
        Ok(Some(guard)) => {
            guard.release().await?;
            None
        }
        Ok(None) => None,
        Err(error @ Error::Unsupported { .. }) => Some(error.to_string()),
        Err(error) => return Err(error.into()),
    };
    session.close().await?;
    Ok(why)
}

/// Measures one N: the mutex and EX (in the order `ex_first` says), then the
/// mixed workload, each on its own lock named after `prefix` and `round`,
/// each between two readings of `counters`.
pub async fn measure<C: ServerCounters>(
    n: usize,
    round: usize,
    args: &ModesArgs,
    prefix: &str,
    client: &mut dyn FnMut() -> Client,
    counters: &mut C,
) -> Row {
    let seconds = args.seconds;
    let ex_first = round % 2 == 1;
    let mutex_name = format!("{prefix}modes-mutex-{round}");
    let ex_name = format!("{prefix}modes-ex-{round}");
    let (mutex, ex) = if ex_first {
        let ex = counted(counters, ex_run(n, seconds, &ex_name, client)).await;
        let mutex = counted(counters, mutex_run(n, seconds, &mutex_name, client)).await;
        (mutex, ex)
    } else {
        let mutex = counted(counters, mutex_run(n, seconds, &mutex_name, client)).await;
        (mutex, counted(counters, ex_run(n, seconds, &ex_name, client)).await)
    };
    let mixed_name = format!("{prefix}modes-mixed-{round}");
    let mixed = counted(counters, mixed_run(n, seconds, &mixed_name, args.seed, client)).await;
    Row {
        n,
        ex_first,
        mutex,
        ex,
        mixed,
    }
}
