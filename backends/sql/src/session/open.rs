//! Opening a session: the owning connection, the tables checked, the
//! session registered (and the restart grace read), the control
//! connection, and the background tasks started.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use lockline::{Error, Result, SessionOptions, SessionState};
use tokio::sync::watch;
use tokio::time::Instant;

use super::{Shared, SqlSession};
use crate::dialect::{Dialect, Purpose};
use crate::error::{map, Doing};
use crate::notices::Notices;
use crate::pool::WaitPool;

impl<D: Dialect> SqlSession<D> {
    /// Opens a session: the owning connection, the tables checked, the
    /// session registered, the heartbeat started.
    pub(crate) async fn open(
        dialect: Arc<D>,
        target: String,
        options: SessionOptions,
        wait_connections: usize,
        restart_grace: bool,
        reset_grace: bool,
    ) -> Result<Self> {
        let doing = Doing {
            backend: dialect.backend(),
            what: "open a session",
            target: &target,
        };
        let connect_timeout = options.connect_timeout();
        let id = uuid::Uuid::new_v4().simple().to_string();
        let opening = async {
            let (mut conn, server_id) = dialect.connect(Purpose::Owner).await.map_err(|e| map(doing, e))?;
            dialect.prepare(&mut conn).await?;
            let ttl_ms = i64::try_from(options.ttl().as_millis()).unwrap_or(i64::MAX);
            // The session's first confirmation is the statement that
            // registers it: its loss deadline counts from the moment that
            // statement is sent, not from the connection and the check of
            // the tables before it (seconds, on a server slow to answer),
            // which the server's count of the TTL does not include either.
            let opened_at = Instant::now();
            let grace = dialect.open(&mut conn, &id, ttl_ms).await.map_err(|e| map(doing, e))?;
            // The whole grace, counted from the answer's arrival (after the
            // grace began): whenever this session opened in it, it waits all
            // of it by its own clock.
            let grace = grace.map(|g| {
                let ms = u64::try_from(g.ms).unwrap_or(0);
                (Instant::now() + Duration::from_millis(ms), g.id)
            });
            let (control, _) = dialect.connect(Purpose::Control).await.map_err(|e| map(doing, e))?;
            Ok::<_, Error>((conn, server_id, control, grace, opened_at))
        };
        let (conn, owner_server_id, control, grace, opened_at) =
            match tokio::time::timeout(connect_timeout, opening).await {
                Ok(opened) => opened?,
                Err(_) => {
                    return Err(Error::unavailable(
                        dialect.backend(),
                        format!("no session opened on {target} within the connect timeout {connect_timeout:?}"),
                    ))
                }
            };
        let (notices, notices_task) = if dialect.notifies() {
            let (notices, task) = Notices::start(
                Arc::clone(&dialect),
                options.keepalive_interval(),
                options.request_timeout(),
            );
            (Some(notices), Some(task))
        } else {
            (None, None)
        };
        let shared = Arc::new(Shared {
            dialect,
            id,
            target,
            options,
            state: watch::Sender::new(SessionState::Live),
            owner: tokio::sync::Mutex::new(Some(conn)),
            owner_server_id,
            owner_confirmed: std::sync::Mutex::new(opened_at),
            proving: AtomicBool::new(false),
            control: tokio::sync::Mutex::new(Some(control)),
            waits: WaitPool::new(wait_connections),
            overflow: std::sync::Mutex::new(HashMap::new()),
            next_overflow: std::sync::atomic::AtomicU64::new(0),
            reaping: std::sync::Mutex::new(std::collections::HashSet::new()),
            departures: std::sync::Mutex::new(HashMap::new()),
            beats: std::sync::Mutex::new(HashMap::new()),
            grace_until: grace.filter(|&(until, _)| restart_grace && until > Instant::now()),
            grace_ended: tokio::sync::Mutex::new(false),
            reset_grace,
            entries: std::sync::Mutex::new(HashMap::new()),
            behind: std::sync::Mutex::new(HashMap::new()),
            turns_read: std::sync::Mutex::new(HashMap::new()),
            queue_reads: std::sync::Mutex::new(HashMap::new()),
            notices,
        });
        let keepalive = tokio::spawn(Arc::clone(&shared).keep_alive(opened_at)).abort_handle();
        let prove = tokio::spawn(Arc::clone(&shared).prove_owner_each_interval(opened_at)).abort_handle();
        let overflow = tokio::spawn(Arc::clone(&shared).check_overflow()).abort_handle();
        let mut tasks = vec![keepalive, prove, overflow];
        tasks.extend(notices_task);
        if let Some((until, _)) = shared.grace_until {
            let waited = Arc::clone(&shared);
            tasks.push(
                tokio::spawn(async move {
                    tokio::time::sleep_until(until).await;
                    waited.end_grace().await;
                })
                .abort_handle(),
            );
        }
        let state = shared.state.subscribe();
        Ok(SqlSession { shared, state, tasks })
    }
}
