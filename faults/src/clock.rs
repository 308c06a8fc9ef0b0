//! One clock for every process of a run: `CLOCK_MONOTONIC`, which all processes
//! on one machine share (unlike [`std::time::Instant`], whose values cannot be
//! compared across processes). Times are nanoseconds.

/// Now on the machine's monotonic clock, in nanoseconds.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own; CLOCK_MONOTONIC always exists on Linux.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs * 1_000_000_000 + nanos
}

/// Nanoseconds as seconds, for reports.
pub fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// A duration in nanoseconds.
pub fn ns(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}
