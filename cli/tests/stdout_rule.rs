//! With a COMMAND, standard output is the command's alone: the held key goes
//! to standard error, and to standard output only with `--print-key`.
//! Without a command the key is printed on standard output, as `etcdctl lock`
//! does. For `lock` and `elect`, on etcd, ZooKeeper, PostgreSQL and MariaDB;
//! on ZooKeeper the server comes from `ZOOKEEPER_CONNECT`, on the databases
//! from `DATABASE_URL`.

mod support;

use lockline_testkit::{EtcdCluster, ZkEnsemble};
use support::{holding, lockline, Running};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `server` is how `lockline` is pointed at the server: flags, or nothing
/// when `variable` (`(name, value)`) names it.
fn only_the_commands_output_reaches_stdout(server: &[String], variable: Option<(&str, &str)>, prefix: &str) {
    let run = |subcommand: &str, args: &[&str]| {
        let mut command = lockline(subcommand, server);
        if let Some((name, value)) = variable {
            command.env(name, value);
        }
        command.args(args).output().expect("run lockline")
    };
    for (subcommand, args) in [
        ("lock", vec!["stdout/lock", "sh", "-c", "echo hello"]),
        ("elect", vec!["stdout/elect", "node-a", "sh", "-c", "echo hello"]),
        ("lock", vec!["stdout/lock", "--", "sh", "-c", "echo hello"]),
    ] {
        let out = run(subcommand, &args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{subcommand} {args:?}: {stderr}");
        assert_eq!(text(&out.stdout), "hello\n", "{subcommand} {args:?}: stderr {stderr}");
        let (key, token) = stderr
            .lines()
            .find_map(holding)
            .unwrap_or_else(|| panic!("no holding line on stderr: {stderr}"));
        assert!(key.starts_with(&format!("{prefix}{}/", args[0])), "{key}");
        assert!(token > 0);
    }

    // --print-key: the key on standard output too, order not promised.
    let out = run("lock", &["--print-key", "stdout/lock", "sh", "-c", "echo hello"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let mut lines: Vec<&str> = stdout.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(lines.contains(&"hello"), "{stdout}");
    assert!(
        lines.iter().any(|l| l.starts_with(&format!("{prefix}stdout/lock/"))),
        "{stdout}"
    );

    // Without a command, the key is lockline's output.
    for (subcommand, args) in [
        ("lock", vec!["stdout/bare"]),
        ("elect", vec!["stdout/bare-elect", "node-a"]),
    ] {
        let mut command = lockline(subcommand, server);
        if let Some((name, value)) = variable {
            command.env(name, value);
        }
        command.args(&args);
        let mut holder = Running::spawn(subcommand, command);
        let key = holder.stdout_line();
        assert!(key.starts_with(&format!("{prefix}{}/", args[0])), "{key}");
        assert_eq!(holder.holding().0, key);
        holder.signal(libc::SIGTERM);
        assert_eq!(holder.exits().code(), Some(0));
        assert!(holder.rest_of_stdout().is_empty());
    }
}

#[test]
fn only_the_commands_output_reaches_stdout_on_etcd() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let server = vec!["--etcd".to_owned(), cluster.endpoints().join(",")];
    only_the_commands_output_reaches_stdout(&server, None, "");
}

#[test]
fn only_the_commands_output_reaches_stdout_on_zookeeper_named_by_zookeeper_connect() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let connect = ensemble.connect_string();
    only_the_commands_output_reaches_stdout(&[], Some(("ZOOKEEPER_CONNECT", &connect)), "/");
}

#[test]
fn only_the_commands_output_reaches_stdout_on_postgres_named_by_database_url() {
    let (_server, args) = support::postgres();
    only_the_commands_output_reaches_stdout(&[], Some(("DATABASE_URL", &args[1])), "");
}

#[test]
fn only_the_commands_output_reaches_stdout_on_mariadb_named_by_database_url() {
    let (_server, args) = support::mariadb();
    only_the_commands_output_reaches_stdout(&[], Some(("DATABASE_URL", &args[1])), "");
}
