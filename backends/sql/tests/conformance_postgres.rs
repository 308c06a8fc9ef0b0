//! The conformance suite against a real PostgreSQL server started for each case.

mod support;

use support::PgFixture;

lockline::conformance_tests!(PgFixture::start());

// Lock-delay needs the backend to tell a release from a loss.
lockline::conformance_tests!(@cases PgFixture::start(); lock_delay_holds_back_after_an_involuntary_loss_only, lock_modes_lock_delay_after_an_involuntary_loss_only);
