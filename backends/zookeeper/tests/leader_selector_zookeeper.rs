//! `LeaderSelector` on ZooKeeper under silent partitions: the leader's link
//! is cut (packets dropped, nothing reset) over and over, and never do two
//! works run at once.

use std::time::Duration;

use lockline::conformance::selectors_exclude_under_partitions;
use lockline::{Client, SessionOptions};
use lockline_testkit::{TcpProxy, ZkEnsemble};
use lockline_zookeeper::ZooKeeper;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_works_at_a_time_while_leaders_are_cut_off() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let proxies: Vec<TcpProxy> = (0..3)
        .map(|_| TcpProxy::start(&ensemble.address(0)).expect("proxy"))
        .collect();
    let clients = proxies
        .iter()
        .map(|proxy| Client::new(ZooKeeper::new(proxy.address())))
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
