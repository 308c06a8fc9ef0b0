//! Scale of one session holding many locks, and of many sessions in one
//! process, against a `redis-server` this program starts itself.
//!
//! ```text
//! cargo run --release -p lockline-redis --example scale_redis [-- --locks 100000 --sessions 1000 --in-flight 64 --ttl 10 --ttls 2]
//! ```
//!
//! **Many locks on one session** (`--locks N`, default 100,000; 0 skips it):
//! one session acquires N mutexes `scale/0 .. scale/N-1`, `--in-flight`
//! (default 64) acquires at once, spread over 64 tasks that each take the
//! next number until none is left. Printed: the time and rate; the client's
//! resident memory (`VmRSS`) and live heap (a counting global allocator)
//! per held lock, measured just before the first acquire and just after the
//! last. Both include everything the program keeps per lock: the guard and
//! its slot in the `Vec` of guards, the core's per-hold state (its monitor
//! task, its loss channel, the same-session queue), and the backend's
//! per-entry tracking; the mutex handles are dropped once locked. They also
//! include allocator growth that is not per lock (the heap kept by glibc's
//! arenas and the tasks' buffers). Then the server's view: session keys,
//! client connections (`CLIENT LIST`), pub/sub channels; whether every lock
//! is still held after two keepalive intervals, and how long
//! `session.close()` takes (it deletes every entry).
//!
//! **Many sessions** (`--sessions M`, default 1,000; 0 skips it): one client
//! opens M sessions, each holding one lock, through a byte-counting proxy.
//! After one keepalive interval to settle, the server's
//! `total_commands_processed` and the bytes each way are counted over
//! `--ttls` TTLs and printed per session per TTL, with the commands behind
//! them (`INFO commandstats`).

use std::time::Duration;

use lockline::Client;
use lockline_bench::scale::{self, CountingAlloc, CountingProxy, ScaleArgs, ScaleServer};
use lockline_bench::BoxResult;
use lockline_redis::Redis;
use lockline_testkit::RedisServer;

#[global_allocator]
static HEAP: CountingAlloc = CountingAlloc::new();

#[tokio::main]
async fn main() -> BoxResult<()> {
    let args = ScaleArgs::from_env()?;
    let mut server = Server {
        server: RedisServer::start()?,
        keepalive_start: (0, Vec::new()),
    };
    scale::run(&mut server, &args, &HEAP).await
}

/// The Redis server, and its counters at the keepalive window's start.
struct Server {
    server: RedisServer,
    keepalive_start: (u64, Vec<(String, u64)>),
}

impl Server {
    /// Lines of `CLIENT LIST` other than the `redis-cli` asking.
    fn connections(&self) -> BoxResult<Vec<String>> {
        Ok(self
            .server
            .cli(&["CLIENT", "LIST"])?
            .lines()
            .filter(|l| !l.contains("cmd=client|list"))
            .map(str::to_owned)
            .collect())
    }

    fn count_keys(&self, pattern: &str) -> BoxResult<usize> {
        Ok(self.server.cli(&["--scan", "--pattern", pattern])?.lines().count())
    }

    /// One `INFO` field.
    fn info(&self, section: &str, field: &str) -> BoxResult<u64> {
        let text = self.server.cli(&["INFO", section])?;
        text.lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':')?.trim().parse().ok())
            .ok_or_else(|| format!("no {field} in INFO {section}").into())
    }

    /// Calls per command from `INFO commandstats`.
    fn command_calls(&self) -> BoxResult<Vec<(String, u64)>> {
        Ok(self
            .server
            .cli(&["INFO", "commandstats"])?
            .lines()
            .filter_map(|l| {
                let (name, stats) = l.strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = stats.split(',').find_map(|f| f.strip_prefix("calls="))?.parse().ok()?;
                Some((name.to_owned(), calls))
            })
            .collect())
    }
}

impl ScaleServer for Server {
    fn client(&self) -> Client {
        Client::new(Redis::new(self.server.url()))
    }

    async fn locks_view(&mut self) -> BoxResult<String> {
        Ok(format!(
            "server: {} session key(s), {} client connection(s), {} pub/sub channel(s) subscribed",
            self.count_keys("lockline:session:*")?,
            self.connections()?.len(),
            self.server
                .cli(&["PUBSUB", "CHANNELS"])?
                .lines()
                .filter(|l| !l.is_empty())
                .count(),
        ))
    }

    async fn closed_line(&mut self, outcome: &str, took: Duration) -> BoxResult<String> {
        Ok(format!(
            "session.close() {outcome} in {took:.2?}; keys left on the server: {} ({} of them the locks' fencing counters NAME:seq, as many their epochs NAME:run)",
            self.server.cli(&["DBSIZE"])?.trim(),
            self.count_keys("*:seq")?,
        ))
    }

    fn proxy_target(&self) -> String {
        format!("127.0.0.1:{}", self.server.port())
    }

    fn proxied_client(&self, proxy: &str) -> Client {
        Client::new(Redis::new(format!("redis://{proxy}")))
    }

    async fn sessions_view(&mut self, _proxy: &CountingProxy) -> BoxResult<String> {
        Ok(format!(
            "server: {} session keys, {} client connections",
            self.count_keys("lockline:session:*")?,
            self.connections()?.len()
        ))
    }

    async fn keepalive_start(&mut self) -> BoxResult<()> {
        self.keepalive_start = (self.info("stats", "total_commands_processed")?, self.command_calls()?);
        Ok(())
    }

    async fn keepalive_end(&mut self, per_session_ttl: &dyn Fn(f64) -> f64) -> BoxResult<(String, Vec<String>)> {
        let (commands_before, calls_before) = std::mem::take(&mut self.keepalive_start);
        let calls_after = self.command_calls()?;
        // The two INFO commandstats and the INFO stats asking are no keepalive.
        let commands = self.info("stats", "total_commands_processed")? - commands_before - 3;
        let mut by_command: Vec<(String, u64)> = calls_after
            .iter()
            .filter(|(name, _)| !name.starts_with("info"))
            .map(|(name, after)| {
                let before = calls_before.iter().find(|(n, _)| n == name).map_or(0, |(_, b)| *b);
                (name.clone(), after - before)
            })
            .filter(|(_, delta)| *delta > 0)
            .collect();
        by_command.sort_by_key(|(_, delta)| std::cmp::Reverse(*delta));
        let breakdown: Vec<String> = by_command
            .iter()
            .map(|(name, delta)| format!("{name} {:.2}", per_session_ttl(*delta as f64)))
            .collect();
        Ok((
            format!(
                "server counted {:.2} commands (those its scripts run included)",
                per_session_ttl(commands as f64)
            ),
            vec![format!("  by command: {}", breakdown.join(", "))],
        ))
    }
}
