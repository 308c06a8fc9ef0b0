//! Scale of one session holding many locks, and of many sessions in one
//! process, against a standalone ZooKeeper this program starts itself, with
//! `zkServer.sh`'s JVM settings (1000 MiB heap).
//!
//! ```text
//! cargo run --release -p lockline-zookeeper --example scale_zookeeper [-- --locks 100000 --sessions 1000 --in-flight 64 --ttl 10 --ttls 2]
//! ```
//!
//! **Many locks on one session** (`--locks N`, default 100,000; 0 skips it):
//! one session acquires N mutexes `/scale/0 .. /scale/N-1`, `--in-flight`
//! (default 64) acquires at once, spread over 64 tasks that each take the
//! next number until none is left. Printed: the time and rate; the client's
//! resident memory (`VmRSS`) and live heap (a counting global allocator)
//! per held lock, measured just before the first acquire and just after the
//! last. Both include everything the program keeps per lock: the guard and
//! its slot in the `Vec` of guards, the core's per-hold state (its monitor
//! task, the same-session queue), and the backend's watch on the entry (the
//! ZooKeeper client's watcher); the mutex handles are dropped once locked.
//! They also include allocator growth that is not per lock (glibc's arenas,
//! the client's buffers). Then the server's view (`mntr`, `wchs`, `dump`):
//! client connections, sessions with ephemeral nodes, ephemeral nodes,
//! watches and the connections they are on; whether every lock is still held
//! after two keepalive intervals, and how long `session.close()` (the
//! ZooKeeper session's close) takes.
//!
//! **Many sessions** (`--sessions M`, default 1,000; 0 skips it): one client
//! opens M sessions (each its own ZooKeeper session and connection, through
//! a byte-counting proxy), each holding one lock. After one keepalive
//! interval to settle, the server's `zk_packets_received` and
//! `zk_packets_sent` and the bytes each way are counted over `--ttls` TTLs
//! and printed per session per TTL: the ZooKeeper client's pings and
//! lockline's own `sync` every keepalive interval, which confirms the
//! session through the leader.

use std::time::Duration;

use lockline::Client;
use lockline_bench::scale::{self, CountingAlloc, CountingProxy, ScaleArgs, ScaleServer};
use lockline_bench::BoxResult;
use lockline_testkit::{ZkEnsemble, ZkJvm, ZkOptions};
use lockline_zookeeper::ZooKeeper;

#[global_allocator]
static HEAP: CountingAlloc = CountingAlloc::new();

#[tokio::main]
async fn main() -> BoxResult<()> {
    let args = ScaleArgs::from_env()?;
    let ensemble = ZkEnsemble::start_with(
        1,
        &ZkOptions {
            jvm: ZkJvm::Production,
            ..ZkOptions::default()
        },
    )?;
    let mut server = Server {
        ensemble,
        keepalive_start: (0, 0),
    };
    scale::run(&mut server, &args, &HEAP).await
}

/// The ZooKeeper server, and its packet counts at the keepalive window's
/// start.
struct Server {
    ensemble: ZkEnsemble,
    keepalive_start: (u64, u64),
}

impl Server {
    /// One number from `mntr`.
    fn mntr(&self, field: &str) -> BoxResult<u64> {
        let text = self.ensemble.four_letter(0, "mntr").ok_or("no answer to mntr")?;
        text.lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix('\t')?.trim().parse().ok())
            .ok_or_else(|| format!("no {field} in mntr").into())
    }

    /// `wchs`: how many connections watch how many paths, and the watches.
    fn watch_summary(&self) -> String {
        self.ensemble
            .four_letter(0, "wchs")
            .unwrap_or_default()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Sessions that own ephemeral nodes, from `dump`.
    fn sessions_with_ephemerals(&self) -> String {
        let dump = self.ensemble.four_letter(0, "dump").unwrap_or_default();
        dump.lines()
            .find_map(|l| l.trim().strip_prefix("Sessions with Ephemerals ("))
            .and_then(|rest| rest.split(')').next())
            .unwrap_or("?")
            .to_owned()
    }

    /// The server's view; `mntr`'s own connection is not counted.
    fn server_view(&self) -> BoxResult<String> {
        Ok(format!(
            "{} client connection(s), {} session(s) with ephemeral nodes, {} ephemeral nodes; watches: {}",
            self.mntr("zk_num_alive_connections")?.saturating_sub(1),
            self.sessions_with_ephemerals(),
            self.mntr("zk_ephemerals_count")?,
            self.watch_summary(),
        ))
    }
}

impl ScaleServer for Server {
    fn client(&self) -> Client {
        Client::new(ZooKeeper::new(self.ensemble.connect_string()))
    }

    fn locks_prefix(&self) -> &str {
        "/scale/"
    }

    fn sessions_prefix(&self) -> &str {
        "/sessions/"
    }

    async fn locks_view(&mut self) -> BoxResult<String> {
        Ok(format!("server: {}", self.server_view()?))
    }

    async fn closed_line(&mut self, outcome: &str, took: Duration) -> BoxResult<String> {
        Ok(format!(
            "session.close() {outcome} in {took:.2?}; {} ephemeral nodes left",
            self.mntr("zk_ephemerals_count")?
        ))
    }

    fn proxy_target(&self) -> String {
        self.ensemble.address(0)
    }

    fn proxied_client(&self, proxy: &str) -> Client {
        Client::new(ZooKeeper::new(proxy))
    }

    async fn sessions_view(&mut self, _proxy: &CountingProxy) -> BoxResult<String> {
        Ok(format!("server: {}", self.server_view()?))
    }

    async fn keepalive_start(&mut self) -> BoxResult<()> {
        // Each `mntr` is one packet received and one sent on its own connection.
        self.keepalive_start = (self.mntr("zk_packets_received")?, self.mntr("zk_packets_sent")?);
        Ok(())
    }

    async fn keepalive_end(&mut self, per_session_ttl: &dyn Fn(f64) -> f64) -> BoxResult<(String, Vec<String>)> {
        let (received_before, sent_before) = self.keepalive_start;
        let received = self.mntr("zk_packets_received")? - received_before - 2;
        let sent = self.mntr("zk_packets_sent")? - sent_before - 2;
        Ok((
            format!(
                "server received {:.2} packets and sent {:.2}",
                per_session_ttl(received as f64),
                per_session_ttl(sent as f64),
            ),
            Vec::new(),
        ))
    }
}
