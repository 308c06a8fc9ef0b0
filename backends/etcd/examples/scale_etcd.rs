//! Scale of one session holding many locks, and of many sessions in one
//! process, against a single-node etcd this program starts itself.
//!
//! ```text
//! cargo run --release -p lockline-etcd --example scale_etcd [-- --locks 100000 --sessions 1000 --in-flight 64 --ttl 10 --ttls 2]
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
//! task, the same-session queue), and the backend's watch on the entry (its
//! channel and its place in the session's watch hub); the mutex handles are
//! dropped once locked. They also include allocator growth that is not per
//! lock (glibc's arenas, gRPC buffers). Then the server's view: leases
//! (`LeaseLeases`), watch streams and watchers
//! (`etcd_debugging_mvcc_watch_stream_total`, `..._watcher_total`), open
//! gRPC streams by method; whether every lock is still held after two
//! keepalive intervals, and how long `session.close()` (the lease's revoke)
//! takes.
//!
//! **Many sessions** (`--sessions M`, default 1,000; 0 skips it): one client
//! (so one gRPC connection, through a byte-counting proxy) opens M
//! sessions, each holding one lock. After one keepalive interval to settle,
//! the server's `LeaseKeepAlive` messages received
//! (`grpc_server_msg_received_total`), its `etcd_debugging_lease_renewed_total`
//! and the bytes each way are counted over `--ttls` TTLs and printed per
//! session per TTL.

use std::time::Duration;

use lockline::Client;
use lockline_bench::scale::{self, CountingAlloc, CountingProxy, ScaleArgs, ScaleServer};
use lockline_bench::BoxResult;
use lockline_etcd::{etcd_client, Etcd};
use lockline_testkit::EtcdCluster;

#[global_allocator]
static HEAP: CountingAlloc = CountingAlloc::new();

#[tokio::main]
async fn main() -> BoxResult<()> {
    let args = ScaleArgs::from_env()?;
    let mut server = Server {
        cluster: EtcdCluster::start()?,
        leases_before: 0,
        keepalive_start: (0.0, 0.0),
    };
    scale::run(&mut server, &args, &HEAP).await
}

/// The etcd server, and its counts before the sessions and at the
/// keepalive window's start.
struct Server {
    cluster: EtcdCluster,
    leases_before: usize,
    keepalive_start: (f64, f64),
}

const KEEPALIVE: &str = "grpc_method=\"LeaseKeepAlive\"";

impl Server {
    /// The sum of the samples of metric `name` whose labels contain `labels`.
    fn metric(&self, name: &str, labels: &str) -> f64 {
        let text = self.cluster.metrics(0).unwrap_or_default();
        text.lines()
            .filter(|l| {
                l.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
                    && l.contains(labels)
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// gRPC streams the server has open for `method` (started, not yet handled).
    fn open_streams(&self, method: &str) -> f64 {
        let label = format!("grpc_method=\"{method}\"");
        self.metric("grpc_server_started_total", &label) - self.metric("grpc_server_handled_total", &label)
    }

    async fn leases(&self) -> BoxResult<usize> {
        let mut client = etcd_client::Client::connect(self.cluster.endpoints(), None).await?;
        Ok(client.leases().await?.leases().len())
    }

    /// LeaseKeepAlive messages received and leases renewed.
    fn keepalive_counts(&self) -> (f64, f64) {
        (
            self.metric("grpc_server_msg_received_total", KEEPALIVE),
            self.metric("etcd_debugging_lease_renewed_total", ""),
        )
    }
}

impl ScaleServer for Server {
    fn client(&self) -> Client {
        Client::new(Etcd::new(self.cluster.endpoints()))
    }

    async fn locks_view(&mut self) -> BoxResult<String> {
        Ok(format!(
            "server: {} lease(s); {} watch stream(s) with {} watchers; open gRPC streams: {} LeaseKeepAlive, {} Watch",
            self.leases().await?,
            self.metric("etcd_debugging_mvcc_watch_stream_total", ""),
            self.metric("etcd_debugging_mvcc_watcher_total", ""),
            self.open_streams("LeaseKeepAlive"),
            self.open_streams("Watch"),
        ))
    }

    async fn closed_line(&mut self, outcome: &str, took: Duration) -> BoxResult<String> {
        Ok(format!(
            "session.close() (the lease's revoke) {outcome} in {took:.2?}; {} lease(s) left",
            self.leases().await?
        ))
    }

    fn proxy_target(&self) -> String {
        format!("127.0.0.1:{}", self.cluster.client_port(0))
    }

    fn proxied_client(&self, proxy: &str) -> Client {
        Client::new(Etcd::new([format!("http://{proxy}")]))
    }

    async fn before_sessions(&mut self) -> BoxResult<()> {
        self.leases_before = self.leases().await?;
        Ok(())
    }

    async fn sessions_view(&mut self, proxy: &CountingProxy) -> BoxResult<String> {
        Ok(format!(
            "server: {} leases; {} watch streams with {} watchers; open gRPC streams: {} LeaseKeepAlive, {} Watch; {} client connection(s)",
            self.leases().await? - self.leases_before,
            self.metric("etcd_debugging_mvcc_watch_stream_total", ""),
            self.metric("etcd_debugging_mvcc_watcher_total", ""),
            self.open_streams("LeaseKeepAlive"),
            self.open_streams("Watch"),
            proxy.connections(),
        ))
    }

    async fn keepalive_start(&mut self) -> BoxResult<()> {
        self.keepalive_start = self.keepalive_counts();
        Ok(())
    }

    async fn keepalive_end(&mut self, per_session_ttl: &dyn Fn(f64) -> f64) -> BoxResult<(String, Vec<String>)> {
        let (received_before, renewed_before) = self.keepalive_start;
        let (received, renewed) = self.keepalive_counts();
        Ok((
            format!(
                "server received {:.2} LeaseKeepAlive requests and renewed {:.2} times",
                per_session_ttl(received - received_before),
                per_session_ttl(renewed - renewed_before),
            ),
            Vec::new(),
        ))
    }
}
