//! A value too large for the server is refused at once with a typed error,
//! never retried until the caller gives up.

use lockline::conformance::values_too_large_are_refused;
use lockline::Client;
use lockline_testkit::ZkEnsemble;
use lockline_zookeeper::ZooKeeper;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_too_large_for_the_server_are_refused_at_once() {
    let cluster = ZkEnsemble::start().expect("start ZooKeeper");
    values_too_large_are_refused(&Client::new(ZooKeeper::new(cluster.connect_string())), "/large/state").await;
}
