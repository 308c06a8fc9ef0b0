//! Each property catches something: a broken twin of the rule violates it,
//! in a configuration where the sound rule keeps it (see `sound.rs`).

use lockline_model::{property, Config, QueueModel, Rule};

/// Asserts that `rule` violates the property it is meant to break, in the
/// configuration it is shown on.
fn assert_breaks(rule: Rule) {
    let (Some(target), Some(config)) = (rule.breaks(), rule.shown_on()) else {
        panic!("{rule:?} breaks nothing");
    };
    let report = QueueModel::new(config, rule).find(target);
    assert!(
        report.violates(target),
        "{rule:?} on {}: `{target}` held in {} states (violated: {:?})",
        report.config,
        report.unique_states,
        report.violated_names()
    );
}

#[test]
fn waking_every_waiter_is_a_herd() {
    assert_breaks(Rule::WakeEveryWaiter);
}

#[test]
fn waking_on_a_change_that_still_blocks_is_a_herd() {
    assert_breaks(Rule::WakeOnAnyChange);
}

#[test]
fn a_newcomer_compatible_with_the_holders_bypasses_a_waiter() {
    assert_breaks(Rule::BypassWaiters);
}

#[test]
fn an_undetected_conversion_deadlock_stands() {
    assert_breaks(Rule::NoDeadlockDetection);
}

#[test]
fn the_pairwise_deadlock_check_misses_a_cycle_through_a_waiting_request() {
    assert_breaks(Rule::PairwiseDeadlockDetection);
}

#[test]
fn the_earliest_mark_giving_up_leaves_a_deadlock_standing() {
    assert_breaks(Rule::EarliestMarkGivesUp);
}

#[test]
fn deferring_to_any_later_mark_leaves_two_conversions_asleep_on_each_other() {
    assert_breaks(Rule::DeferToAnyLaterMark);
    // Three PR holders converting to EX: the one marked last gives up, the
    // two left wait on each other for ever.
    let report = QueueModel::new(Config::three_conversions(), Rule::DeferToAnyLaterMark).find(property::ALL_END);
    assert!(report.violates(property::ALL_END), "{:?}", report.violated_names());
}

#[test]
fn every_conversion_on_a_cycle_giving_up_fails_one_that_a_later_mark_blocked() {
    assert_breaks(Rule::EveryConversionOnCycleGivesUp);
}

#[test]
fn a_deadlocked_conversion_that_keeps_its_mark_leaves_it_behind() {
    assert_breaks(Rule::KeepMarkOnDeadlock);
}

#[test]
fn a_conversion_granted_from_the_read_before_its_mark_breaks_exclusion() {
    assert_breaks(Rule::GrantBeforeMark);
}

#[test]
fn a_conversion_grant_that_leaves_other_conversions_unwritten_breaks_exclusion() {
    assert_breaks(Rule::ConversionGrantLeavesOthers);
}

#[test]
fn a_writer_grant_that_leaves_pending_grants_unwritten_lets_the_block_lose_its_name() {
    assert_breaks(Rule::WriterGrantLeavesPending);
}

#[test]
fn an_up_conversion_that_keeps_its_token_lets_a_stale_write_in() {
    assert_breaks(Rule::KeepTokenOnConversion);
}

#[test]
fn a_token_taken_at_append_is_refused_after_a_conversion() {
    assert_breaks(Rule::TokenAtAppend);
}

#[test]
fn granting_on_a_wake_up_without_reading_again_breaks_exclusion() {
    assert_breaks(Rule::GrantOnWake);
}

#[test]
fn an_up_conversion_ahead_of_an_earlier_waiter_breaks_exclusion() {
    assert_breaks(Rule::ConversionPassesEarlierWaiters);
}

#[test]
fn counting_a_converting_entry_by_its_new_mode_only_breaks_exclusion() {
    assert_breaks(Rule::ConvertingCountsNewModeOnly);
}

#[test]
fn waking_on_removal_only_misses_a_down_conversion() {
    assert_breaks(Rule::WakeOnRemovalOnly);
    // Across two resources the missed wake-up is a wait that never ends.
    let report = QueueModel::new(Config::down_conversion(), Rule::WakeOnRemovalOnly).find(property::ALL_END);
    assert!(report.violates(property::ALL_END), "{:?}", report.violated_names());
}

#[test]
fn forgetting_an_attempt_lets_a_late_append_leave_an_entry() {
    assert_breaks(Rule::ForgetAttempts);
}

#[test]
fn a_hand_over_not_conditioned_on_the_entries_before_its_grant_breaks_exclusion() {
    // An NL holder ahead converts to PW between the CR holder's release
    // read and its write; the EX request handed the lock joins it.
    assert_breaks(Rule::HandOverUnconditionedEarlier);
}

#[test]
fn a_hand_over_past_an_earlier_waiting_request_bypasses_it() {
    assert_breaks(Rule::HandOverPastWaiters);
}

#[test]
fn a_hand_over_token_taken_at_the_read_falls_below_a_later_grant() {
    assert_breaks(Rule::HandOverTokenAtRead);
}

#[test]
fn a_try_handed_the_lock_leaves_the_value_block_naming_it() {
    assert_breaks(Rule::HandOverToTry);
}

#[test]
fn a_cancel_after_a_hand_over_that_keeps_the_block_name_makes_the_block_look_lost() {
    assert_breaks(Rule::CancelKeepsBlockName);
}

#[test]
fn every_broken_twin_is_tested() {
    // One test above per variant: adding a variant means adding its test.
    assert_eq!(Rule::BROKEN.len(), 24);
    assert!(Rule::BROKEN.iter().all(|rule| rule.breaks().is_some()));
    assert_eq!(Rule::Sound.breaks(), None);
    // The sound rule is checked on every configuration a twin is shown on.
    let checked: Vec<&str> = Config::all().iter().map(|config| config.name).collect();
    for rule in Rule::BROKEN {
        let shown_on = rule.shown_on().map(|config| config.name);
        assert!(shown_on.is_some_and(|name| checked.contains(&name)), "{rule:?}");
    }
}

/// The existing recipes take the create revision as their token: without
/// conversions, grants of conflicting entries come in creation order, so the
/// twin that does so keeps every property on them.
#[test]
fn tokens_at_append_are_sound_without_conversions() {
    for config in [Config::mutex(), Config::election(), Config::read_write()] {
        let report = QueueModel::new(config, Rule::TokenAtAppend).check();
        assert!(report.exhaustive);
        assert!(report.violated.is_empty(), "{}: {:?}", report.config, report.violated);
    }
}
