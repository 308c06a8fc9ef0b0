//! `--metrics ADDR`: lockline's metrics served for Prometheus while `lock`
//! or `elect` runs.

use lockline::Error;

/// `--metrics ADDR`: lockline's metrics (with the lock's name: there is
/// one) served for Prometheus at `http://ADDR/metrics` until the process
/// ends. An address that cannot be listened on is refused (123) before
/// anything is contacted.
pub(crate) fn serve(addr: std::net::SocketAddr) -> lockline::Result<()> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    let refused = |why: String| Error::InvalidOptions {
        reason: format!("--metrics {addr}: {why}"),
    };
    // Bound here first, so that an address in use is said now, not by a
    // listener task that fails in the background.
    drop(std::net::TcpListener::bind(addr).map_err(|e| refused(e.to_string()))?);
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), lockline::metrics::BUCKETS)
        .map_err(|e| refused(e.to_string()))?
        .with_http_listener(addr)
        .install()
        .map_err(|e| refused(e.to_string()))?;
    lockline::metrics::include_lock_names(true);
    lockline::metrics::describe();
    Ok(())
}
