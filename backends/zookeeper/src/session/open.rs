//! Opening a session: the ACLs of the nodes it creates, the chroot it
//! needs, and the task that tracks its state started.

use super::departure::WAKE_MEMORY;
use super::liveness::track;
use super::*;

impl AclPolicy {
    /// The ACL of every node this policy creates for `backend`'s sessions.
    ///
    /// `Creator` names the configured identities explicitly (`digest:USER:HASH`,
    /// `sasl:USER`) rather than through ZooKeeper's `auth` scheme: `auth`
    /// grants every identity the connection has, and a TLS connection with a
    /// client certificate also has the certificate's `x509:` identity, which
    /// every client sharing that certificate has too.
    fn acls(self, backend: &ZooKeeper) -> Vec<Acl> {
        match self {
            AclPolicy::Open => Acls::anyone_all().to_vec(),
            AclPolicy::Creator => {
                let mut acls = Vec::new();
                if let Some(digest) = &backend.digest {
                    let id = crate::connect::digest_id(&digest.user, &digest.password);
                    acls.push(Acl::new(Permission::ALL, AuthId::new("digest", &id)));
                }
                if let Some(sasl) = &backend.sasl {
                    acls.push(Acl::new(Permission::ALL, AuthId::new("sasl", &sasl.user)));
                }
                acls.push(Acl::new(Permission::READ, AuthId::anyone()));
                acls
            }
        }
    }
}

/// Creates the connect string's chroot (`host:port/apps/locks`) when it does
/// not exist, as Curator's namespace does: persistent nodes, with the ACL
/// policy's ACLs. One existence check when it does.
async fn ensure_chroot(client: &Client, acls: &[Acl], session: &str) -> Result<()> {
    let chroot = client.path().to_owned();
    if chroot == "/" {
        return Ok(());
    }
    if chroot == "/zookeeper" || chroot.starts_with("/zookeeper/") {
        return Err(Error::InvalidOptions {
            reason: format!("ZooKeeper chroot {chroot:?}: ZooKeeper reserves the /zookeeper subtree"),
        });
    }
    let Ok(root) = client.clone().chroot("/") else {
        return Err(Error::InvalidOptions {
            reason: format!("ZooKeeper chroot {chroot:?} is not a valid path"),
        });
    };
    match root.check_stat(&chroot).await {
        Ok(Some(_)) => return Ok(()),
        Ok(None) => {}
        Err(ZkError::NoAuth) => return Err(denied("read the chroot", &chroot)),
        Err(error) => return Err(map(error, session)),
    }
    tracing::debug!(%chroot, "creating the ZooKeeper chroot");
    let mode = CreateMode::Persistent.with_acls(Acls::new(acls));
    let mut path = String::new();
    for part in chroot.trim_start_matches('/').split('/') {
        path.push('/');
        path.push_str(part);
        match root.create(&path, b"", &mode).await {
            Ok(_) | Err(ZkError::NodeExists) => {}
            Err(ZkError::NoAuth) => return Err(denied("create the chroot", &path)),
            Err(ZkError::NoChildrenForEphemerals) => {
                return Err(Error::InvalidOptions {
                    reason: format!(
                        "ZooKeeper chroot {chroot:?} cannot be created: {:?} is an ephemeral node",
                        path.rsplit_once('/').map_or("/", |(parent, _)| parent)
                    ),
                })
            }
            Err(error) => return Err(map(error, session)),
        }
    }
    Ok(())
}

impl ZkSession {
    pub(crate) async fn open(backend: &ZooKeeper, options: &SessionOptions) -> Result<Arc<Self>> {
        // The connect request is the session's first confirmation: the server
        // starts its expiry clock no earlier than this.
        let sent = Instant::now();
        let client = crate::connect::connect(backend, options).await?;
        let id = format!("{:x}", client.session_id().0);
        let info = client.session().clone();
        let acls = backend.acl_policy.acls(backend);
        // Dropping the client on an error closes the session again.
        ensure_chroot(&client, &acls, &id).await?;
        let state = watch::Sender::new(SessionState::Live);
        // Declare the session lost a safety margin before the server could
        // expire it: the negotiated timeout less the margin, counted from the
        // last confirmation.
        let negotiated = client.session_timeout();
        // A server that caps the timeout below the TTL asked for (its
        // maxSessionTimeout) gets the same margin as a share of what it
        // granted, so a long TTL does not eat the whole negotiated timeout.
        let ttl = options.ttl();
        let margin = if negotiated < ttl && !ttl.is_zero() {
            options
                .safety_margin()
                .mul_f64(negotiated.as_secs_f64() / ttl.as_secs_f64())
        } else {
            options.safety_margin()
        };
        let margin = margin.min(negotiated / 2);
        let loss_deadline = negotiated.saturating_sub(margin);
        let report_lag = negotiated / 4;
        let liveness = Arc::new(Liveness::new(sent, loss_deadline, report_lag));
        // Often enough that, counted a report lag back, a confirmation stays
        // well inside the deadline: a confirmation counts once one sent a
        // report lag later is answered, so the deadline must leave room for
        // the lag and two intervals.
        let interval = options
            .keepalive_interval()
            .min(negotiated / 6)
            .min(loss_deadline.saturating_sub(report_lag) / 3);
        let slot = Arc::new(StdMutex::new(Some(client.clone())));
        let tracker = tokio::spawn(track(
            client,
            Arc::clone(&slot),
            Arc::clone(&liveness),
            state.clone(),
            interval,
        ))
        .abort_handle();
        tracing::debug!(session = %id, ?negotiated, "ZooKeeper session opened");
        Ok(Arc::new(ZkSession {
            id,
            client: slot,
            state,
            liveness,
            tracker,
            uncertain: StdMutex::default(),
            backend: backend.clone(),
            info,
            options: options.clone(),
            refused: StdMutex::default(),
            acls,
            held: StdMutex::default(),
            wakes: StdMutex::default(),
            wake_memory: WAKE_MEMORY.min(negotiated / 2),
            queues: StdMutex::default(),
            writes: AtomicU64::new(0),
        }))
    }
}
