//! Attacks on lockline-sql's promises (`docs/sql.md`, "PostgreSQL and
//! MariaDB/MySQL (`lockline-sql`)", and `docs/guarantees.md`), on real
//! PostgreSQL and MariaDB servers. Tests that exposed a defect say so in a
//! comment ("Was a defect, now fixed") and name what broke; all are
//! regression tests now.
//!
//! One test binary, a module per family: `appends`, `wait_connections`,
//! `names_and_values`, `cuts` (silent cuts at each step), `server` (what
//! the server does on its own), `drops` (futures dropped midway).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockline::{Client, SessionState};
use lockline_sql::Sql;
use lockline_testkit::TcpProxy;

#[path = "../attack_kit/mod.rs"]
mod attack_kit;
#[path = "../support/mod.rs"]
mod support;

use attack_kit::{options, step, within, Side};
use support::db::Db;

mod appends;
mod cuts;
mod drops;
mod names_and_values;
mod server;
mod wait_connections;
