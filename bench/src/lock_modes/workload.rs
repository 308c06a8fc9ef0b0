//! The mixed workload: the modes by weight, the conversion each makes,
//! the seeded dice that draw them, and what a converting holder surely
//! holds.

use lockline::LockMode;

/// The mixed workload's modes and their weights: read-mostly, as a DLM's
/// users mostly are.
pub const MIXED_WEIGHTS: [(LockMode, u64); 6] = [
    (LockMode::Nl, 1),
    (LockMode::Cr, 4),
    (LockMode::Cw, 2),
    (LockMode::Pr, 7),
    (LockMode::Pw, 2),
    (LockMode::Ex, 4),
];

/// One grant in this many is converted before its release.
pub const MIXED_CONVERT_ONE_IN: u64 = 4;

/// The mode a mixed contender holding `mode` converts to: up from NL, CR,
/// CW and PR, down from PW and EX.
pub fn mixed_conversion(mode: LockMode) -> LockMode {
    match mode {
        LockMode::Nl | LockMode::Pr => LockMode::Ex,
        LockMode::Cr => LockMode::Pw,
        LockMode::Cw => LockMode::Pr,
        LockMode::Pw => LockMode::Cr,
        LockMode::Ex => LockMode::Pr,
    }
}

/// The mixed workload in words, for the programs' output and docs.
pub fn mixed_description() -> String {
    let weights: Vec<String> = MIXED_WEIGHTS.iter().map(|(m, w)| format!("{m} {w}")).collect();
    let total: u64 = MIXED_WEIGHTS.iter().map(|(_, w)| w).sum();
    let conversions: Vec<String> = LockMode::ALL
        .iter()
        .map(|&m| format!("{m}→{}", mixed_conversion(m)))
        .collect();
    format!(
        "modes by weight {} (of {total}); one grant in {MIXED_CONVERT_ONE_IN} converts ({}) before its release",
        weights.join(", "),
        conversions.join(", ")
    )
}

/// A small seeded generator (SplitMix64): the same seed gives every
/// contender the same sequence of modes on every run and every backend.
#[derive(Debug, Clone)]
pub struct Dice(u64);

impl Dice {
    /// Contender `who`'s dice for the run seeded with `seed`.
    pub fn new(seed: u64, who: usize) -> Self {
        Dice(seed ^ (who as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..bound` (`bound` > 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound
    }

    /// The next mixed request: a mode by [`MIXED_WEIGHTS`], and the mode it
    /// converts to before its release, if it does.
    pub fn mixed_request(&mut self) -> (LockMode, Option<LockMode>) {
        let total: u64 = MIXED_WEIGHTS.iter().map(|(_, w)| w).sum();
        let mut roll = self.below(total);
        let mut mode = LockMode::Ex;
        for (m, weight) in MIXED_WEIGHTS {
            if roll < weight {
                mode = m;
                break;
            }
            roll -= weight;
        }
        let converts = self.below(MIXED_CONVERT_ONE_IN) == 0;
        (mode, converts.then(|| mixed_conversion(mode)))
    }
}

/// The most restrictive mode that excludes nothing `a` or `b` admits: what
/// a holder converting between them holds for sure (the lower one, when one
/// is down from the other; CR between CW and PR).
pub fn common(a: LockMode, b: LockMode) -> LockMode {
    LockMode::ALL
        .into_iter()
        .rev()
        .find(|m| m.is_down_from(a) && m.is_down_from(b))
        .unwrap_or(LockMode::Nl)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dice_follow_the_weights_and_the_seed() {
        let mut dice = Dice::new(1, 0);
        let mut seen = std::collections::HashMap::new();
        let mut converted = 0;
        let draws = 40_000;
        for _ in 0..draws {
            let (mode, to) = dice.mixed_request();
            *seen.entry(mode).or_insert(0u64) += 1;
            if let Some(to) = to {
                assert_eq!(to, mixed_conversion(mode));
                converted += 1;
            }
        }
        let total: u64 = MIXED_WEIGHTS.iter().map(|(_, w)| w).sum();
        for (mode, weight) in MIXED_WEIGHTS {
            let expected = draws as f64 * weight as f64 / total as f64;
            let got = seen.get(&mode).copied().unwrap_or(0) as f64;
            assert!(
                (got - expected).abs() < expected * 0.1 + 50.0,
                "{mode}: {got} for {expected}"
            );
        }
        let expected = draws as f64 / MIXED_CONVERT_ONE_IN as f64;
        assert!((converted as f64 - expected).abs() < expected * 0.1);
        let replay: Vec<_> = (0..8).map(|_| Dice::new(5, 3).mixed_request()).collect();
        assert!(replay.windows(2).all(|w| w[0] == w[1]), "same seed, same draws");
        let (mut a, mut b) = (Dice::new(5, 3), Dice::new(5, 4));
        assert_ne!(
            (0..8).map(|_| a.next_u64()).collect::<Vec<_>>(),
            (0..8).map(|_| b.next_u64()).collect::<Vec<_>>(),
            "contenders draw differently"
        );
    }

    #[test]
    fn conversions_go_both_ways() {
        let up: Vec<_> = LockMode::ALL
            .iter()
            .filter(|&&m| !mixed_conversion(m).is_down_from(m))
            .collect();
        assert_eq!(up, [&LockMode::Nl, &LockMode::Cr, &LockMode::Cw, &LockMode::Pr]);
        assert!(LockMode::ALL.iter().all(|&m| mixed_conversion(m) != m));
        assert_eq!(
            mixed_description(),
            "modes by weight NL 1, CR 4, CW 2, PR 7, PW 2, EX 4 (of 20); one grant in 4 converts \
             (NL→EX, CR→PW, CW→PR, PR→EX, PW→CR, EX→PR) before its release"
        );
    }

    #[test]
    fn a_conversion_holds_what_both_modes_exclude() {
        use LockMode::*;
        assert_eq!(common(Cw, Pr), Cr);
        assert_eq!(common(Pr, Cw), Cr);
        assert_eq!(common(Pr, Ex), Pr);
        assert_eq!(common(Ex, Pr), Pr);
        assert_eq!(common(Nl, Ex), Nl);
        assert_eq!(common(Cr, Pw), Cr);
        assert_eq!(common(Pw, Cr), Cr);
        for a in LockMode::ALL {
            assert_eq!(common(a, a), a);
        }
    }
}
