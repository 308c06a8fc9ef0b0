//! The conformance suite against a real PostgreSQL server started for each case.

mod support;

use support::PgFixture;

lockline::conformance_tests!(PgFixture::start());
