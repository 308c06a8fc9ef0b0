//! The backend the command line chooses: one server, from its flag or from
//! the environment (`ETCDCTL_ENDPOINTS`, `ZOOKEEPER_CONNECT`, then
//! `DATABASE_URL`), and its TLS and credentials, from flags and their
//! variables, each for its own backend; then the client made of them.

use lockline::{Client, Tls};
use lockline_etcd::Etcd;
use lockline_redis::Redis;
use lockline_sql::Sql;
use lockline_zookeeper::{AclPolicy, ZooKeeper};

use crate::args::Args;
use crate::command_line::Connection;
use crate::secrets::scheme;

/// The server the command line names.
#[derive(PartialEq)]
pub(crate) enum Server {
    Etcd(Vec<String>),
    ZooKeeper(String),
    Redis(String),
    /// A `postgres://` or `postgresql://` URL.
    Postgres(String),
    /// A `mysql://` or `mariadb://` URL (MariaDB or MySQL).
    MySql(String),
}

impl Server {
    /// The flag that names this kind of server.
    pub(crate) fn flag(&self) -> &'static str {
        match self {
            Server::Etcd(_) => "--etcd",
            Server::ZooKeeper(_) => "--zookeeper",
            Server::Redis(_) => "--redis",
            Server::Postgres(_) => "--postgres",
            Server::MySql(_) => "--mysql",
        }
    }
}

/// URLs may hold a password: `Debug` shows only their scheme.
impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let url = |url: &str| format!("{}://…", scheme(url).unwrap_or("?"));
        match self {
            Server::Etcd(endpoints) => f.debug_tuple("Etcd").field(endpoints).finish(),
            Server::ZooKeeper(hosts) => f.debug_tuple("ZooKeeper").field(hosts).finish(),
            Server::Redis(address) => f.debug_tuple("Redis").field(&url(address)).finish(),
            Server::Postgres(address) => f.debug_tuple("Postgres").field(&url(address)).finish(),
            Server::MySql(address) => f.debug_tuple("MySql").field(&url(address)).finish(),
        }
    }
}

/// The SQL server a database URL names, by its scheme (any case), or what
/// is wrong with it; `origin` is the flag or variable it came from. The URL
/// itself is never part of the message: it may hold a password.
fn database(origin: &str, url: &str) -> Result<Server, String> {
    let expected = "postgres://, postgresql://, mysql:// or mariadb://";
    let Some(found) = scheme(url) else {
        return Err(format!(
            "{origin} is not a URL (no SCHEME://); expected {expected}, e.g. postgres://USER:PASSWORD@HOST:5432/DATABASE"
        ));
    };
    let server = match found.to_ascii_lowercase().as_str() {
        "postgres" | "postgresql" => Server::Postgres(url.to_owned()),
        "mysql" | "mariadb" => Server::MySql(url.to_owned()),
        _ => {
            return Err(format!(
                "{origin} has the scheme {found}://, which lockline does not speak; expected {expected}"
            ))
        }
    };
    match (origin, &server) {
        ("--postgres", Server::MySql(_)) => Err(format!(
            "--postgres takes a postgres:// or postgresql:// URL; a {found}:// URL goes to --mysql"
        )),
        ("--mysql", Server::Postgres(_)) => Err(format!(
            "--mysql takes a mysql:// or mariadb:// URL; a {found}:// URL goes to --postgres"
        )),
        _ => Ok(server),
    }
}

/// TLS and credentials, from flags and `ETCDCTL_*` variables. Passwords
/// never appear in `Debug` output or in any message.
#[derive(Default, PartialEq)]
pub(crate) struct Security {
    pub(crate) cacert: Option<String>,
    pub(crate) cert: Option<String>,
    pub(crate) key: Option<String>,
    /// etcd user and password.
    pub(crate) user: Option<(String, String)>,
    pub(crate) marker_prefix: Option<String>,
    /// ZooKeeper scheme (`digest` or `sasl`), user and password.
    pub(crate) zk_auth: Option<(String, String, String)>,
    pub(crate) zk_acl: Option<AclPolicy>,
}

impl std::fmt::Debug for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Security")
            .field("cacert", &self.cacert)
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("user", &self.user.as_ref().map(|(name, _)| name))
            .field("marker_prefix", &self.marker_prefix)
            .field(
                "zk_auth",
                &self.zk_auth.as_ref().map(|(scheme, user, _)| (scheme, user)),
            )
            .field("zk_acl", &self.zk_acl)
            .finish()
    }
}

/// The server and its security, as the command line chooses them:
/// `connection`'s flags, `given` telling the TLS and credential flags given
/// on the command line from those filled in by their variables, and `env`
/// the server variables (an empty one unset).
pub(crate) fn choose(
    connection: Connection,
    given: impl Fn(&str) -> bool,
    env: impl Fn(&str) -> Option<String>,
) -> Result<(Server, Security), String> {
    let flags = connection.security;
    let from = |id: &str, value: Option<String>| value.filter(|v| given(id) || !v.is_empty());
    let mut security = Security {
        cacert: from("cacert", flags.cacert),
        cert: from("cert", flags.cert),
        key: from("key", flags.key),
        user: None,
        marker_prefix: flags.marker_prefix,
        zk_auth: None,
        zk_acl: match flags.zk_acl.as_deref() {
            None => None,
            Some("open") => Some(AclPolicy::Open),
            Some("creator") => Some(AclPolicy::Creator),
            Some(other) => return Err(format!("--zk-acl: {other:?} is not open or creator")),
        },
    };
    let user_spec = from("user", flags.user);
    let password = from("password", flags.password);
    let zk_spec = from("zk_auth", flags.zk_auth);

    // At most one server flag (clap refuses two). Without one,
    // ETCDCTL_ENDPOINTS and ZOOKEEPER_CONNECT stand in for the flags, and
    // DATABASE_URL (set for many an application, so the more specific ones
    // win) when neither is set.
    let server_flags = connection.server;
    let mut database_url = false;
    let server = if let Some(list) = server_flags.etcd {
        Server::Etcd(endpoints(&list).ok_or("--etcd needs endpoints")?)
    } else if let Some(hosts) = server_flags.zookeeper {
        Server::ZooKeeper(hosts)
    } else if let Some(url) = server_flags.redis {
        Server::Redis(url)
    } else if let Some(url) = server_flags.postgres {
        database("--postgres", &url)?
    } else if let Some(url) = server_flags.mysql {
        database("--mysql", &url)?
    } else {
        match (env("ETCDCTL_ENDPOINTS"), env("ZOOKEEPER_CONNECT")) {
            (Some(_), Some(_)) => {
                return Err("both ETCDCTL_ENDPOINTS and ZOOKEEPER_CONNECT are set: choose one server with --etcd or --zookeeper, or unset one of them".to_owned())
            }
            (Some(list), None) => Server::Etcd(endpoints(&list).ok_or("ETCDCTL_ENDPOINTS holds no endpoint")?),
            (None, Some(hosts)) => Server::ZooKeeper(hosts),
            (None, None) => match env("DATABASE_URL") {
                Some(url) => {
                    database_url = true;
                    database("DATABASE_URL", &url)?
                }
                None => {
                    return Err(
                        "a server is required: --etcd, --zookeeper, --redis, --postgres or --mysql, or one of ETCDCTL_ENDPOINTS, ZOOKEEPER_CONNECT or DATABASE_URL".to_owned(),
                    )
                }
            },
        }
    };
    // The etcdctl variables are for etcd, LOCKLINE_ZK_AUTH for ZooKeeper:
    // elsewhere they are not read, and only flags are refused.
    let flagged = [
        "cacert",
        "cert",
        "key",
        "user",
        "password",
        "marker_prefix",
        "zk_auth",
        "zk_acl",
    ]
    .iter()
    .any(|id| given(id));
    let etcd_only = |id: &str, value: Option<String>| value.filter(|_| given(id) || matches!(server, Server::Etcd(_)));
    security.cacert = etcd_only("cacert", security.cacert);
    security.cert = etcd_only("cert", security.cert);
    security.key = etcd_only("key", security.key);
    let user_given = given("user");
    let password_given = given("password");
    let user_spec = etcd_only("user", user_spec);
    let password = etcd_only("password", password);
    let zk_spec = zk_spec.filter(|_| given("zk_auth") || matches!(server, Server::ZooKeeper(_)));
    match server {
        Server::Redis(_) | Server::Postgres(_) | Server::MySql(_) => {
            if flagged {
                let given = if database_url {
                    format!("with DATABASE_URL ({})", server.flag())
                } else {
                    format!("with {}", server.flag())
                };
                let example = match server {
                    Server::Postgres(_) => {
                        "postgres://USER:PASSWORD@HOST:5432/DATABASE?sslmode=verify-full&sslrootcert=ca.pem"
                    }
                    Server::MySql(_) => {
                        "mysql://USER:PASSWORD@HOST:3306/DATABASE?ssl-mode=VERIFY_IDENTITY&ssl-ca=ca.pem"
                    }
                    _ => "redis://:PASSWORD@HOST:PORT, rediss:// for TLS",
                };
                return Err(format!(
                    "TLS and credential flags are for --etcd and --zookeeper; {given} put them in the URL ({example})"
                ));
            }
            security = Security::default();
        }
        Server::Etcd(_) => {
            if let Some(spec) = &user_spec {
                // --password, then NAME:PASSWORD, then ETCDCTL_PASSWORD.
                let (name, inline) = match spec.split_once(':') {
                    Some((name, inline)) => (name, Some(inline.to_owned())),
                    None => (spec.as_str(), None),
                };
                let (flag, variable) = match password {
                    Some(password) if password_given => (Some(password), None),
                    other => (None, other),
                };
                security.user = Some(user(name, flag.or(inline).or(variable), "--user")?);
            } else if password_given {
                return Err("--password needs --user NAME".to_owned());
            }
            if zk_spec.is_some() || security.zk_acl.is_some() {
                return Err("--zk-auth and --zk-acl are for --zookeeper; with etcd use --user".to_owned());
            }
        }
        Server::ZooKeeper(_) => {
            security.zk_auth = zk_spec.map(|spec| zk_auth(&spec)).transpose()?;
            if user_given || password_given || security.marker_prefix.is_some() {
                return Err(
                    "--user, --password and --marker-prefix are for --etcd; with ZooKeeper use --zk-auth".to_owned(),
                );
            }
        }
    }
    if security.cert.is_some() != security.key.is_some() {
        return Err("--cert and --key go together".to_owned());
    }
    if security.cert.is_some() && security.cacert.is_none() {
        return Err("--cert and --key need --cacert (the CA that signed the servers' certificates)".to_owned());
    }
    Ok((server, security))
}

/// A user name and the password found for it.
fn user(name: &str, password: Option<String>, flag: &str) -> Result<(String, String), String> {
    if name.is_empty() {
        return Err(format!("{flag}: the user name is empty"));
    }
    let password = password
        .ok_or_else(|| format!("{flag} {name}: no password; give {name}:PASSWORD, --password or ETCDCTL_PASSWORD"))?;
    Ok((name.to_owned(), password))
}

/// `SCHEME:USER:PASSWORD` for ZooKeeper (`digest` or `sasl`).
fn zk_auth(spec: &str) -> Result<(String, String, String), String> {
    let mut parts = spec.splitn(3, ':');
    let (scheme, user, password) = (parts.next(), parts.next(), parts.next());
    match (scheme, user, password) {
        (Some(scheme @ ("digest" | "sasl")), Some(user), Some(password)) if !user.is_empty() => {
            Ok((scheme.to_owned(), user.to_owned(), password.to_owned()))
        }
        (Some(scheme), _, _) if scheme != "digest" && scheme != "sasl" => Err(format!(
            "--zk-auth: unknown scheme {scheme:?}; use digest:USER:PASSWORD or sasl:USER:PASSWORD"
        )),
        _ => Err("--zk-auth: expected digest:USER:PASSWORD or sasl:USER:PASSWORD".to_owned()),
    }
}

/// The endpoints of a comma-separated list, when it has any.
fn endpoints(list: &str) -> Option<Vec<String>> {
    let endpoints: Vec<String> = list.split(',').filter(|e| !e.is_empty()).map(str::to_owned).collect();
    (!endpoints.is_empty()).then_some(endpoints)
}

/// The client of the backend the arguments name, with their TLS and
/// credentials.
pub(crate) fn client(args: &Args) -> lockline::Result<Client> {
    let security = &args.security;
    let tls = match &security.cacert {
        None => None,
        Some(ca) => {
            let tls = Tls::new().with_ca_file(ca)?;
            Some(match (&security.cert, &security.key) {
                (Some(cert), Some(key)) => tls.with_client_files(cert, key)?,
                _ => tls,
            })
        }
    };
    Ok(match &args.server {
        Server::Etcd(endpoints) => {
            let mut etcd = Etcd::new(endpoints.clone());
            if let Some(tls) = tls {
                etcd = etcd.with_tls(tls);
            }
            if let Some((user, password)) = &security.user {
                etcd = etcd.with_user(user.clone(), password.clone());
            }
            if let Some(prefix) = &security.marker_prefix {
                etcd = etcd.with_marker_prefix(prefix.clone());
            }
            Client::new(etcd)
        }
        Server::ZooKeeper(hosts) => {
            let mut zk = ZooKeeper::new(hosts.clone());
            if let Some(tls) = tls {
                zk = zk.with_tls(tls);
            }
            match &security.zk_auth {
                Some((scheme, user, password)) if scheme == "sasl" => {
                    zk = zk.with_sasl_digest_md5(user.clone(), password.clone());
                }
                Some((_, user, password)) => zk = zk.with_digest(user.clone(), password.clone()),
                None => {}
            }
            if let Some(policy) = security.zk_acl {
                zk = zk.with_acl_policy(policy);
            }
            Client::new(zk)
        }
        Server::Redis(url) => Client::new(Redis::new(url.clone())),
        // Credentials and TLS are in the URL.
        Server::Postgres(url) | Server::MySql(url) => Client::new(Sql::new(url.clone())),
    })
}

#[cfg(test)]
mod tests {
    use super::Server;
    use crate::args::tests::{args, with_env};

    #[test]
    fn zookeeper_connect_stands_in_for_the_flag_and_both_variables_are_refused() {
        let zk = with_env("lock x", &[("ZOOKEEPER_CONNECT", "z1:2181,z2:2181/apps")]).expect("parse");
        assert_eq!(zk.server, Server::ZooKeeper("z1:2181,z2:2181/apps".into()));
        let both = [
            ("ZOOKEEPER_CONNECT", "z1:2181"),
            ("ETCDCTL_ENDPOINTS", "http://e1:2379"),
        ];
        let error = with_env("lock x", &both).expect_err("both variables without a flag");
        assert!(
            error.contains("ETCDCTL_ENDPOINTS") && error.contains("ZOOKEEPER_CONNECT") && !error.contains('\n'),
            "{error}"
        );
        // A flag picks, whichever variables are set.
        let etcd = with_env("lock --etcd http://f:1 x", &both).expect("parse");
        assert_eq!(etcd.server, Server::Etcd(vec!["http://f:1".into()]));
        let zk = with_env("lock --zookeeper f:1 x", &both).expect("parse");
        assert_eq!(zk.server, Server::ZooKeeper("f:1".into()));
        let zk = with_env("lock --zookeeper f:1 x", &[("ETCDCTL_ENDPOINTS", "http://e1:2379")]).expect("parse");
        assert_eq!(zk.server, Server::ZooKeeper("f:1".into()));
        let etcd = with_env("lock --etcd http://f:1 x", &[("ZOOKEEPER_CONNECT", "z1:2181")]).expect("parse");
        assert_eq!(etcd.server, Server::Etcd(vec!["http://f:1".into()]));
    }

    #[test]
    fn takes_tls_and_credentials_from_flags_as_etcdctl_names_them() {
        let parsed =
            args("lock --etcd https://a:1 --cacert ca.pem --cert c.pem --key k.pem --user alice:pw1 x").expect("parse");
        let security = &parsed.security;
        assert_eq!(security.cacert.as_deref(), Some("ca.pem"));
        assert_eq!(security.cert.as_deref(), Some("c.pem"));
        assert_eq!(security.key.as_deref(), Some("k.pem"));
        assert_eq!(security.user, Some(("alice".into(), "pw1".into())));
        let split = args("lock --etcd https://a:1 --cacert ca.pem --user alice --password pw:2 x").expect("parse");
        assert_eq!(split.security.user, Some(("alice".into(), "pw:2".into())));
        let zk =
            args("lock --zookeeper h:1 --cacert ca.pem --zk-auth digest:bob:p:w --zk-acl creator x").expect("parse");
        assert_eq!(zk.security.zk_auth, Some(("digest".into(), "bob".into(), "p:w".into())));
        assert_eq!(zk.security.zk_acl, Some(lockline_zookeeper::AclPolicy::Creator));
    }

    #[test]
    fn etcdctl_endpoints_stands_in_for_the_flag() {
        // The TLS and credential variables are read by clap from the
        // process's environment: `tests/cli_arguments/` runs them.
        let vars = [("ETCDCTL_ENDPOINTS", "https://e1:2379,https://e2:2379")];
        let parsed = with_env("lock x", &vars).expect("parse");
        assert_eq!(
            parsed.server,
            Server::Etcd(vec!["https://e1:2379".into(), "https://e2:2379".into()])
        );
        let flagged = with_env("lock --etcd https://f:1 x", &vars).expect("parse");
        assert_eq!(flagged.server, Server::Etcd(vec!["https://f:1".into()]));
        let error = with_env("lock x", &[("ETCDCTL_ENDPOINTS", ",")]).expect_err("no endpoint");
        assert!(error.contains("holds no endpoint"), "{error}");
    }

    #[test]
    fn refuses_flags_of_the_other_backend_and_half_set_credentials() {
        for line in [
            "lock --zookeeper h:1 --user a:b x",
            "lock --zookeeper h:1 --marker-prefix p/ x",
            "lock --etcd http://a:1 --zk-auth digest:a:b x",
            "lock --etcd http://a:1 --zk-acl creator x",
            "lock --etcd http://a:1 --cacert ca --cert c x",
            "lock --etcd http://a:1 --cert c --key k x",
            "lock --etcd http://a:1 --user alice x",
            "lock --etcd http://a:1 --password pw x",
            "lock --zookeeper h:1 --zk-auth world:a:b x",
            "lock --zookeeper h:1 --zk-auth digest:nopassword x",
            "lock --zookeeper h:1 --zk-acl everyone x",
        ] {
            assert!(args(line).is_err(), "accepted: {line}");
        }
    }

    #[test]
    fn takes_postgres_and_mysql_urls_of_their_own_schemes() {
        let pg = args("lock --postgres postgres://u:p@db:5432/app x").expect("parse");
        assert_eq!(pg.server, Server::Postgres("postgres://u:p@db:5432/app".into()));
        let pg = args("list --postgres=POSTGRESQL://db/app x").expect("parse");
        assert_eq!(pg.server, Server::Postgres("POSTGRESQL://db/app".into()));
        for url in ["mysql://u:p@db:3306/app", "mariadb://db/app"] {
            let my = args(&format!("elect --mysql {url} x p")).expect("parse");
            assert_eq!(my.server, Server::MySql(url.into()));
        }
        for (line, says) in [
            ("lock --postgres mysql://db/app x", "goes to --mysql"),
            ("lock --mysql postgres://db/app x", "goes to --postgres"),
            ("lock --mysql redis://db x", "scheme redis://"),
            ("lock --postgres db:5432/app x", "not a URL"),
            ("lock --postgres", "a value is required for '--postgres"),
            (
                "lock --postgres postgres://db/a --mysql mysql://db/a x",
                "--postgres and --mysql cannot be used together",
            ),
            (
                "lock --mysql mysql://db/a --etcd http://e:1 x",
                "--etcd and --mysql cannot be used together",
            ),
            (
                "lock --zookeeper z:1 --postgres postgres://db/a x",
                "--zookeeper and --postgres cannot be used together",
            ),
            (
                "lock --postgres postgres://db/a --redis redis://r x",
                "--redis and --postgres cannot be used together",
            ),
            // The existing pairs keep their words.
            (
                "lock --zookeeper z:1 --etcd http://e:1 x",
                "--etcd and --zookeeper cannot be used together",
            ),
            (
                "lock --redis redis://r --etcd http://e:1 x",
                "--etcd and --redis cannot be used together",
            ),
        ] {
            let error = args(line).expect_err(line);
            assert!(error.contains(says) && !error.contains('\n'), "{line}: {error}");
        }
        // The same flag twice: the last one counts.
        let twice = args("lock --postgres postgres://a/x --postgres postgres://b/x x").expect("parse");
        assert_eq!(twice.server, Server::Postgres("postgres://b/x".into()));
    }

    #[test]
    fn database_url_is_the_last_fallback_and_its_scheme_is_checked() {
        let pg = with_env("lock x", &[("DATABASE_URL", "postgresql://u:p@db/app")]).expect("parse");
        assert_eq!(pg.server, Server::Postgres("postgresql://u:p@db/app".into()));
        let my = with_env("lock x", &[("DATABASE_URL", "mariadb://u:p@db/app")]).expect("parse");
        assert_eq!(my.server, Server::MySql("mariadb://u:p@db/app".into()));
        // Flags and the other servers' variables win; a DATABASE_URL they
        // override is not even read.
        let bad = ("DATABASE_URL", "sqlite://app.db");
        let etcd = with_env("lock x", &[bad, ("ETCDCTL_ENDPOINTS", "http://e:1")]).expect("parse");
        assert_eq!(etcd.server, Server::Etcd(vec!["http://e:1".into()]));
        let zk = with_env("lock x", &[bad, ("ZOOKEEPER_CONNECT", "z:1")]).expect("parse");
        assert_eq!(zk.server, Server::ZooKeeper("z:1".into()));
        let flag = with_env("lock --mysql mysql://db/a x", &[bad]).expect("parse");
        assert_eq!(flag.server, Server::MySql("mysql://db/a".into()));
        for (url, says) in [
            (
                "sqlite://app.db",
                "DATABASE_URL has the scheme sqlite://, which lockline does not speak; expected postgres://, postgresql://, mysql:// or mariadb://",
            ),
            ("redis://:SECRET-5@r:6379", "DATABASE_URL has the scheme redis://"),
            ("host=db user=app password=SECRET-5", "DATABASE_URL is not a URL (no SCHEME://)"),
            ("app:SECRET-5://db", "DATABASE_URL is not a URL"),
        ] {
            let error = with_env("lock x", &[("DATABASE_URL", url)]).expect_err(url);
            assert!(error.contains(says), "{url}: {error}");
            assert!(!error.contains("SECRET-5") && !error.contains('\n'), "{url}: {error}");
        }
        // An empty one is not set.
        let error = with_env("lock x", &[("DATABASE_URL", "")]).expect_err("no server");
        assert!(
            error.contains("a server is required") && error.contains("DATABASE_URL"),
            "{error}"
        );
    }

    #[test]
    fn sql_servers_take_tls_and_credentials_in_the_url() {
        for line in [
            "lock --postgres postgres://db/a --cacert ca.pem x",
            "lock --postgres postgres://db/a --user alice:pw x",
            "lock --mysql mysql://db/a --password pw x",
            "lock --mysql mysql://db/a --zk-auth digest:a:b x",
            "lock --postgres postgres://db/a --marker-prefix p/ x",
        ] {
            let error = args(line).expect_err(line);
            assert!(error.contains("put them in the URL"), "{line}: {error}");
        }
        let error = args("lock --postgres postgres://db/a --cacert ca.pem x").expect_err("TLS flag");
        assert!(
            error.contains("with --postgres") && error.contains("sslmode="),
            "{error}"
        );
        let error = args("lock --mysql mysql://db/a --cacert ca.pem x").expect_err("TLS flag");
        assert!(error.contains("with --mysql") && error.contains("ssl-mode="), "{error}");
        let error = with_env("lock --cacert ca.pem x", &[("DATABASE_URL", "postgres://db/a")]).expect_err("TLS flag");
        assert!(error.contains("with DATABASE_URL (--postgres)"), "{error}");
    }
}
