//! `LeaderSelector` on etcd under silent partitions: the leader's link is
//! cut (packets dropped, nothing reset) over and over, and never do two
//! works run at once.

use std::time::Duration;

use lockline::conformance::selectors_exclude_under_partitions;
use lockline::{Client, SessionOptions};
use lockline_etcd::Etcd;
use lockline_testkit::{EtcdCluster, TcpProxy};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_works_at_a_time_while_leaders_are_cut_off() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let proxies: Vec<TcpProxy> = (0..3)
        .map(|_| TcpProxy::start(&format!("127.0.0.1:{}", cluster.client_port(0))).expect("proxy"))
        .collect();
    let clients = proxies
        .iter()
        .map(|proxy| Client::new(Etcd::new([format!("http://{}", proxy.address())])))
        .collect();
    let options = SessionOptions::new()
        .with_ttl(Duration::from_secs(2))
        .with_connect_timeout(Duration::from_secs(1))
        .with_request_timeout(Duration::from_secs(1));
    selectors_exclude_under_partitions(
        clients,
        options,
        |i, cut| {
            if cut {
                proxies[i].blackhole();
            } else {
                proxies[i].heal();
            }
        },
        5,
    )
    .await;
}

/// A name no session could use ends the loop at once, also while the
/// cluster cannot be reached (it is not retried like an outage).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_name_ends_the_loop_even_with_the_cluster_down() {
    let port = lockline_testkit::free_port().expect("free port");
    let client = Client::new(Etcd::new([format!("http://127.0.0.1:{port}")]));
    let selector = lockline::LeaderSelector::new(client, "a//b", "node");
    let ended =
        lockline::conformance::bounded("the loop ends", selector.run(std::future::pending(), |_| async {})).await;
    assert!(matches!(ended, Err(lockline::Error::InvalidName { .. })), "{ended:?}");
}
