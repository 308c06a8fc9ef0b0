//! Facts about the VMS matrix that the wait rule relies on.

use lockline_model::Mode;

/// Among up-conversions alone, every cycle of "my new mode is blocked by
/// your granted mode" contains two entries that block each other. So the
/// Linux DLM's pairwise check finds every deadlock made of conversions only;
/// what it misses needs a waiting request in the cycle (see the
/// `PairwiseDeadlockDetection` twin).
#[test]
fn every_cycle_of_conversions_holds_a_pair() {
    for n in 2..=4 {
        let mut granted = vec![Mode::Nl; n];
        let mut target = vec![Mode::Nl; n];
        let combinations = 6usize.pow(2 * n as u32);
        for index in 0..combinations {
            let mut rest = index;
            for i in 0..n {
                granted[i] = Mode::ALL[rest % 6];
                rest /= 6;
                target[i] = Mode::ALL[rest % 6];
                rest /= 6;
            }
            let together = (0..n).all(|i| (i + 1..n).all(|j| granted[i].compatible(granted[j])));
            let all_up = (0..n).all(|i| !target[i].is_down_from(granted[i]));
            if !together || !all_up {
                continue;
            }
            let blocked_by = |i: usize, j: usize| !granted[j].compatible(target[i]);
            let cycle = (0..n).all(|i| blocked_by(i, (i + 1) % n));
            let pair = (0..n).any(|i| (0..n).any(|j| i != j && blocked_by(i, j) && blocked_by(j, i)));
            assert!(!cycle || pair, "granted {granted:?}, converting to {target:?}");
        }
    }
}
