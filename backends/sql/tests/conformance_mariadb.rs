//! The conformance suite against a real MariaDB server started for each case.

mod support;

use support::MyFixture;

lockline::conformance_tests!(MyFixture::start());

// Lock-delay needs the backend to tell a release from a loss.
lockline::conformance_tests!(@cases MyFixture::start(); lock_delay_holds_back_after_an_involuntary_loss_only, lock_modes_lock_delay_after_an_involuntary_loss_only);
