//! The `lockline` program on locked-down clusters: TLS with client
//! certificates and users on etcd (flags and `ETCDCTL_*` variables), TLS and
//! credentials on ZooKeeper, and bad credentials refused with exit status 121
//! and one line that names the problem and never the password.

use std::process::{Command, Output};

use lockline_testkit::{ClientAuth, EtcdCluster, Issued, TestCa, ZkEnsemble, ZkOptions, ZkTlsOptions};

mod support;

const ALICE_PASSWORD: &str = "alice-cli-pw-4f1";
const SASL_PASSWORD: &str = "carol-cli-pw-8e2";

fn lockline() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lockline"));
    // The test process's own environment must not leak etcdctl settings in.
    for var in support::VARIABLES {
        command.env_remove(var);
    }
    command
}

fn run(command: &mut Command) -> Output {
    command.output().expect("run lockline")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// etcd over TLS with client certificates required, and authentication on:
/// user `alice` may use `locks/` and the markers' prefix.
struct SecureEtcd {
    ca: TestCa,
    client: Issued,
    cluster: EtcdCluster,
}

impl SecureEtcd {
    fn start() -> Self {
        let ca = TestCa::new("cli test CA").expect("CA");
        let cluster = EtcdCluster::start_tls(&ca, true).expect("etcd with TLS");
        let client = ca.client("lockline-cli").expect("client certificate");
        let endpoints = cluster.endpoints();
        for args in [
            vec!["user", "add", "root", "--new-user-password", "root-pw"],
            vec!["role", "add", "lockers"],
            vec![
                "role",
                "grant-permission",
                "lockers",
                "--prefix=true",
                "readwrite",
                "locks/",
            ],
            vec![
                "role",
                "grant-permission",
                "lockers",
                "--prefix=true",
                "readwrite",
                lockline_etcd::MARKER_PREFIX,
            ],
            vec!["user", "add", "alice", "--new-user-password", ALICE_PASSWORD],
            vec!["user", "grant-role", "alice", "lockers"],
            vec!["auth", "enable"],
        ] {
            let out = cluster.etcdctl(&endpoints).args(&args).output().expect("etcdctl");
            assert!(out.status.success(), "etcdctl {args:?}: {}", text(&out.stderr));
        }
        SecureEtcd { ca, client, cluster }
    }

    fn tls_flags(&self) -> Vec<String> {
        vec![
            "--cacert".into(),
            self.ca.cert().display().to_string(),
            "--cert".into(),
            self.client.cert.display().to_string(),
            "--key".into(),
            self.client.key.display().to_string(),
        ]
    }
}

#[test]
fn etcd_over_tls_with_a_user_from_flags() {
    let etcd = SecureEtcd::start();
    let out = run(lockline()
        .args(["lock", "--etcd", &etcd.cluster.endpoints().join(",")])
        .args(etcd.tls_flags())
        .args(["--user", &format!("alice:{ALICE_PASSWORD}"), "--timeout", "10"])
        .args(["locks/cli", "sh", "-c", "echo token=$LOCKLINE_TOKEN; exit 5"]));
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(5),
        "stdout {stdout} stderr {}",
        text(&out.stderr)
    );
    // Standard output is the command's; the key is on standard error.
    assert!(stdout.starts_with("token=") && stdout.lines().count() == 1, "{stdout}");
    assert!(
        text(&out.stderr).contains("holding locks/cli/"),
        "{}",
        text(&out.stderr)
    );
    assert!(!text(&out.stderr).contains(ALICE_PASSWORD), "{}", text(&out.stderr));
}

#[test]
fn etcd_over_tls_with_everything_from_the_etcdctl_variables() {
    let etcd = SecureEtcd::start();
    let out = run(lockline()
        .env("ETCDCTL_ENDPOINTS", etcd.cluster.endpoints().join(","))
        .env("ETCDCTL_CACERT", etcd.ca.cert())
        .env("ETCDCTL_CERT", &etcd.client.cert)
        .env("ETCDCTL_KEY", &etcd.client.key)
        .env("ETCDCTL_USER", "alice")
        .env("ETCDCTL_PASSWORD", ALICE_PASSWORD)
        .args(["lock", "--timeout", "10", "locks/env", "true"]));
    assert!(
        out.status.success(),
        "status {:?} stderr {}",
        out.status,
        text(&out.stderr)
    );
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("holding locks/env/"),
        "{}",
        text(&out.stderr)
    );
}

/// The one line `lockline` printed about a failure of its own.
fn one_line(out: &Output) -> String {
    let stderr = text(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "expected one line on stderr, got: {stderr}");
    lines[0].to_owned()
}

#[test]
fn etcd_bad_credentials_exit_121_with_one_line_naming_the_problem() {
    let etcd = SecureEtcd::start();
    let wrong = "wrong-pw-7c3";
    let out = run(lockline()
        .args(["lock", "--etcd", &etcd.cluster.endpoints().join(",")])
        .args(etcd.tls_flags())
        .args(["--user", "alice", "--password", wrong, "locks/bad", "true"]));
    assert_eq!(out.status.code(), Some(121), "{}", text(&out.stderr));
    let line = one_line(&out);
    assert!(
        line.contains("authentication failed") && line.contains("alice"),
        "{line}"
    );
    assert!(!line.contains(wrong), "{line}");
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));

    // A user the roles do not allow there: permission denied, naming the key.
    let out = run(lockline()
        .args(["lock", "--etcd", &etcd.cluster.endpoints().join(",")])
        .args(etcd.tls_flags())
        .args(["--user", &format!("alice:{ALICE_PASSWORD}"), "other/x", "true"]));
    assert_eq!(out.status.code(), Some(121), "{}", text(&out.stderr));
    let line = one_line(&out);
    assert!(line.contains("permission denied") && line.contains("other/x"), "{line}");
}

#[test]
fn etcd_without_a_client_certificate_exits_122_saying_tls() {
    let etcd = SecureEtcd::start();
    let out = run(lockline()
        .args(["lock", "--etcd", &etcd.cluster.endpoints().join(",")])
        .args(["--cacert", &etcd.ca.cert().display().to_string()])
        .args(["--user", &format!("alice:{ALICE_PASSWORD}"), "locks/nocert", "true"]));
    assert_eq!(out.status.code(), Some(122), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("TLS"), "{}", text(&out.stderr));
}

fn secure_zookeeper(ca: &TestCa) -> ZkEnsemble {
    let options = ZkOptions {
        tls: Some(ZkTlsOptions {
            server: ca.server("zookeeper").expect("server certificate"),
            client_ca: ca.cert().to_owned(),
            client_auth: ClientAuth::Need,
        }),
        sasl_users: vec![("carol".into(), SASL_PASSWORD.into())],
        ..ZkOptions::default()
    };
    ZkEnsemble::start_with(1, &options).expect("ZooKeeper with TLS and SASL")
}

#[test]
fn zookeeper_over_tls_with_credentials_and_the_creator_policy() {
    let ca = TestCa::new("cli zk CA").expect("CA");
    let ensemble = secure_zookeeper(&ca);
    let client = ca.client("lockline-cli").expect("client certificate");
    let connect = ensemble.secure_connect_string().expect("a TLS port");
    let tls = [
        "--cacert".to_owned(),
        ca.cert().display().to_string(),
        "--cert".to_owned(),
        client.cert.display().to_string(),
        "--key".to_owned(),
        client.key.display().to_string(),
    ];
    // Under the Creator policy a directory lockline creates, parents
    // included, belongs to the identity that created it: each identity
    // locks under a top-level name of its own.
    for (auth, name) in [
        (format!("digest:dave:{ALICE_PASSWORD}"), "zk-digest/a"),
        (format!("sasl:carol:{SASL_PASSWORD}"), "zk-sasl/a"),
    ] {
        let out = run(lockline()
            .args(["lock", "--zookeeper", &connect])
            .args(&tls)
            .args(["--zk-auth", &auth, "--zk-acl", "creator", "--timeout", "10"])
            .args([name, "sh", "-c", "echo token=$LOCKLINE_TOKEN"]));
        assert!(
            out.status.success(),
            "{auth}: status {:?} stderr {}",
            out.status,
            text(&out.stderr)
        );
        // Standard output is the command's; the key is on standard error.
        let stdout = text(&out.stdout);
        assert!(stdout.starts_with("token=") && stdout.lines().count() == 1, "{stdout}");
        assert!(
            text(&out.stderr).contains(&format!("holding /{name}/")),
            "{}",
            text(&out.stderr)
        );
    }

    // The same with the credentials in the environment.
    let out = run(lockline()
        .env("LOCKLINE_ZK_AUTH", format!("sasl:carol:{SASL_PASSWORD}"))
        .args(["lock", "--zookeeper", &connect])
        .args(&tls)
        .args(["--timeout", "10", "zk-env/a", "true"]));
    assert!(out.status.success(), "stderr {}", text(&out.stderr));

    // A SASL password the server rejects: exit 121, one line, no password.
    let wrong = "not-carols-pw-1a9";
    let out = run(lockline().args(["lock", "--zookeeper", &connect]).args(&tls).args([
        "--zk-auth",
        &format!("sasl:carol:{wrong}"),
        "zk-bad/a",
        "true",
    ]));
    assert_eq!(out.status.code(), Some(121), "{}", text(&out.stderr));
    let line = one_line(&out);
    assert!(
        line.contains("authentication failed") && line.contains("carol"),
        "{line}"
    );
    assert!(!line.contains(wrong), "{line}");
}
