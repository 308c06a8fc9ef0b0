//! What a backend's server counts around each measurement
//! ([`ServerCounters`]), and a measurement run between two readings.

use crate::{BoxError, BoxResult};

use super::Figures;

/// What a backend's server counts, read around each measurement of the
/// section (from before its sessions open until they are closed) and
/// printed per grant: statements and log flushes of a database, commands
/// of Redis, say.
///
/// Called from the program's main task, one call at a time.
#[allow(async_fn_in_trait)] // Used by the examples' main tasks only, never spawned.
pub trait ServerCounters {
    /// What is counted, one column per name (`WAL flushes`, say; the table
    /// adds `/grant`).
    fn names(&self) -> Vec<String>;

    /// Reads the counters before a measurement.
    async fn before(&mut self) -> BoxResult<()>;

    /// Each counter's increase since [`before`](Self::before), divided by
    /// `grants` (every grant of the measurement), in the order of
    /// [`names`](Self::names).
    async fn per_grant(&mut self, grants: u64) -> BoxResult<Vec<f64>>;
}

/// No server counters (the memory backend's).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoCounters;

impl ServerCounters for NoCounters {
    fn names(&self) -> Vec<String> {
        Vec::new()
    }

    async fn before(&mut self) -> BoxResult<()> {
        Ok(())
    }

    async fn per_grant(&mut self, _grants: u64) -> BoxResult<Vec<f64>> {
        Ok(Vec::new())
    }
}

/// Runs one measurement between two readings of `counters`.
pub(super) async fn counted<C: ServerCounters>(
    counters: &mut C,
    measurement: impl std::future::Future<Output = BoxResult<Figures>>,
) -> Result<Figures, String> {
    async {
        counters.before().await?;
        let mut figures = measurement.await?;
        figures.server = counters.per_grant(figures.outcome.all_grants).await?;
        Ok::<_, BoxError>(figures)
    }
    .await
    .map_err(reason)
}

fn reason(error: BoxError) -> String {
    error.to_string()
}
