//! Connections: the settings every connection of a session gets, at
//! startup and again once connected (a pool may drop the startup ones).

use sqlx::postgres::PgConnectOptions;

use super::Postgres;
use crate::dialect::Purpose;
use crate::Settings;

impl Postgres {
    /// The options of a connection for `purpose`, and the statement that
    /// sets its settings again once connected (answering its pid).
    pub(super) fn connect_options(&self, purpose: Purpose) -> (PgConnectOptions, String) {
        let Settings {
            owner_lock_timeout,
            check_interval,
            ..
        } = self.settings;
        let lock_timeout = match purpose {
            // The owning connection never waits long on a row (a fenced
            // commit in flight): its renewals queue behind it.
            Purpose::Owner => format!("{}ms", owner_lock_timeout.as_millis().max(1)),
            Purpose::Control | Purpose::Wait => "0".to_owned(),
        };
        let check = format!("{}ms", check_interval.as_millis().max(1));
        // The server's second line behind the client's bounded round trips
        // (see `ServerKeepalive`); ignored on a Unix socket.
        let probe = self.settings.server_keepalive;
        let (idle, interval, count, user_timeout) = (
            probe.idle_s.to_string(),
            probe.interval_s.to_string(),
            probe.count.to_string(),
            probe.user_timeout_ms.to_string(),
        );
        // Nothing lockline reads is a float: no extra_float_digits, one
        // startup parameter fewer for a pooler to refuse before `options`.
        let settings = [
            ("idle_session_timeout", "0"),
            ("idle_in_transaction_session_timeout", "0"),
            ("statement_timeout", "0"),
            ("lock_timeout", lock_timeout.as_str()),
            ("client_connection_check_interval", check.as_str()),
            ("standard_conforming_strings", "on"),
            ("tcp_keepalives_idle", idle.as_str()),
            ("tcp_keepalives_interval", interval.as_str()),
            ("tcp_keepalives_count", count.as_str()),
            ("tcp_user_timeout", user_timeout.as_str()),
        ];
        let options = self
            .connect
            .clone()
            .application_name("lockline")
            .extra_float_digits(None)
            .options(settings);
        // Set again in the session: a session-mode pool started with
        // `ignore_startup_parameters = options` drops the startup ones.
        let mut set = String::from("SELECT pg_backend_pid()");
        for (name, value) in settings {
            set.push_str(&format!(", set_config('{name}', '{value}', false)"));
        }
        if self.settings.reset_grace {
            set.push_str(", set_config('lockline.reset_grace', 'on', false)");
        }
        (options, set)
    }
}
