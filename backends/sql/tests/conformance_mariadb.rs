//! The conformance suite against a real MariaDB server started for each case.

mod support;

use support::MyFixture;

lockline::conformance_tests!(MyFixture::start());
