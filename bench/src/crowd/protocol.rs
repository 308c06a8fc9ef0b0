//! The lines of the crowd's protocol and what they carry: the window, a
//! child's counts and its grants, in nanoseconds since the UNIX epoch.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Now, in nanoseconds since the UNIX epoch.
pub fn unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| u64::try_from(since.as_nanos()).unwrap_or(u64::MAX))
}

/// One grant, as a child records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantRecord {
    /// The grant's fencing token.
    pub token: u64,
    /// When `lock()` returned ([`unix_nanos`]).
    pub granted_ns: u64,
    /// When the holder began to release ([`unix_nanos`]).
    pub release_started_ns: u64,
}

/// Counters of a child's clients (or the sum over children).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CrowdCounts {
    /// Grants.
    pub grants: u64,
    /// Queued contenders woken because the entry they waited on went away.
    pub wakeups: u64,
    /// Releases.
    pub releases: u64,
}

impl CrowdCounts {
    /// What was counted between `before` and `self`.
    pub fn since(self, before: CrowdCounts) -> CrowdCounts {
        CrowdCounts {
            grants: self.grants.saturating_sub(before.grants),
            wakeups: self.wakeups.saturating_sub(before.wakeups),
            releases: self.releases.saturating_sub(before.releases),
        }
    }

    pub(super) fn add(self, other: CrowdCounts) -> CrowdCounts {
        CrowdCounts {
            grants: self.grants + other.grants,
            wakeups: self.wakeups + other.wakeups,
            releases: self.releases + other.releases,
        }
    }
}

/// The measured window, in nanoseconds since the UNIX epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Start (inclusive).
    pub start_ns: u64,
    /// End (exclusive).
    pub end_ns: u64,
}

impl Window {
    /// How long until the window starts (zero once it has).
    pub fn until_start(&self) -> Duration {
        Duration::from_nanos(self.start_ns.saturating_sub(unix_nanos()))
    }

    /// How long until the window ends (zero once it has).
    pub fn until_end(&self) -> Duration {
        Duration::from_nanos(self.end_ns.saturating_sub(unix_nanos()))
    }

    /// Whether `ns` is within the window.
    pub fn contains(&self, ns: u64) -> bool {
        (self.start_ns..self.end_ns).contains(&ns)
    }

    /// The window's length in seconds.
    pub fn seconds(&self) -> f64 {
        self.end_ns.saturating_sub(self.start_ns) as f64 / 1e9
    }
}

pub(super) fn parse_window(line: &str) -> Option<Window> {
    let mut words = line.split_whitespace();
    if words.next() != Some("window") {
        return None;
    }
    let start_ns = words.next()?.parse().ok()?;
    let end_ns = words.next()?.parse().ok()?;
    Some(Window { start_ns, end_ns })
}

/// A line of a child's report.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum ReportLine {
    Counts(CrowdCounts),
    Grant(GrantRecord),
    Done,
}

pub(super) fn parse_report_line(line: &str) -> Option<ReportLine> {
    let mut words = line.split_whitespace();
    let kind = words.next()?;
    let mut numbers = || words.next().and_then(|w| w.parse::<u64>().ok());
    match kind {
        "counts" => Some(ReportLine::Counts(CrowdCounts {
            grants: numbers()?,
            wakeups: numbers()?,
            releases: numbers()?,
        })),
        "grant" => Some(ReportLine::Grant(GrantRecord {
            token: numbers()?,
            granted_ns: numbers()?,
            release_started_ns: numbers()?,
        })),
        "done" => Some(ReportLine::Done),
        _ => None,
    }
}

/// A grant record, for tests.
#[cfg(test)]
pub(super) fn record(token: u64, granted_ns: u64, release_started_ns: u64) -> GrantRecord {
    GrantRecord {
        token,
        granted_ns,
        release_started_ns,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_lines_round_trip() {
        assert_eq!(
            parse_report_line("counts 5 4 5"),
            Some(ReportLine::Counts(CrowdCounts {
                grants: 5,
                wakeups: 4,
                releases: 5
            }))
        );
        assert_eq!(
            parse_report_line("grant 7 1700000000000000000 1700000000000001000"),
            Some(ReportLine::Grant(record(
                7,
                1_700_000_000_000_000_000,
                1_700_000_000_000_001_000
            )))
        );
        assert_eq!(parse_report_line("done"), Some(ReportLine::Done));
        for bad in ["", "grant 1 2", "counts x 1 2", "hello"] {
            assert_eq!(parse_report_line(bad), None, "{bad:?}");
        }
        assert_eq!(
            parse_window("window 10 20"),
            Some(Window {
                start_ns: 10,
                end_ns: 20
            })
        );
        assert_eq!(parse_window("go"), None);
    }
}
