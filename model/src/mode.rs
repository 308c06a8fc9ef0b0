//! The six lock modes and the VMS compatibility matrix.

use std::fmt;

/// One of the six lock modes of a VMS-style distributed lock manager, from
/// least to most restrictive (CW and PR are not ordered against each other).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mode {
    /// Null: holds a place, blocks no one.
    Nl,
    /// Concurrent read.
    Cr,
    /// Concurrent write.
    Cw,
    /// Protected read.
    Pr,
    /// Protected write.
    Pw,
    /// Exclusive.
    Ex,
}

impl Mode {
    /// Every mode, least restrictive first.
    pub const ALL: [Mode; 6] = [Mode::Nl, Mode::Cr, Mode::Cw, Mode::Pr, Mode::Pw, Mode::Ex];

    /// Whether a lock in this mode may be granted while another is granted in
    /// `other` (the VMS matrix; it is symmetric).
    ///
    /// | held \ asked | NL | CR | CW | PR | PW | EX |
    /// |---|---|---|---|---|---|---|
    /// | NL | Y | Y | Y | Y | Y | Y |
    /// | CR | Y | Y | Y | Y | Y | – |
    /// | CW | Y | Y | Y | – | – | – |
    /// | PR | Y | Y | – | Y | – | – |
    /// | PW | Y | Y | – | – | – | – |
    /// | EX | Y | – | – | – | – | – |
    pub fn compatible(self, other: Mode) -> bool {
        use Mode::*;
        match (self, other) {
            (Nl, _) | (_, Nl) => true,
            (Cr, Ex) | (Ex, Cr) => false,
            (Cr, _) | (_, Cr) => true,
            (Cw, Cw) | (Pr, Pr) => true,
            _ => false,
        }
    }

    /// Whether converting from `from` to this mode is a down-conversion (or no
    /// change): every mode compatible with `from` is compatible with this one,
    /// so it is granted at once. Anything else is an up-conversion, including
    /// CW ⇄ PR, where each mode excludes something the other admits.
    pub fn is_down_from(self, from: Mode) -> bool {
        Mode::ALL.iter().all(|&m| !from.compatible(m) || self.compatible(m))
    }

    /// Whether a grant in this mode may write: CW, PW and EX. An up-conversion
    /// to one of them takes a fresh fencing token.
    pub fn writes(self) -> bool {
        matches!(self, Mode::Cw | Mode::Pw | Mode::Ex)
    }

    /// Whether a holder in this mode writes to the fenced resource in the
    /// model: PW and EX, the modes that exclude every other writer. CW holders
    /// write concurrently by definition, which a fence that refuses every
    /// token below the highest it accepted cannot serve (it would refuse the
    /// older of two live CW holders), so the model gives them no fenced writes.
    pub fn fenced_writer(self) -> bool {
        matches!(self, Mode::Pw | Mode::Ex)
    }

    /// The mode's short name: `NL`, `CR`, `CW`, `PR`, `PW` or `EX`.
    pub fn label(self) -> &'static str {
        match self {
            Mode::Nl => "NL",
            Mode::Cr => "CR",
            Mode::Cw => "CW",
            Mode::Pr => "PR",
            Mode::Pw => "PW",
            Mode::Ex => "EX",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

#[cfg(test)]
mod tests {
    use super::Mode::{self, *};

    #[test]
    fn the_matrix_is_the_vms_one() {
        let rows = [
            (Nl, "YYYYYY"),
            (Cr, "YYYYY-"),
            (Cw, "YYY---"),
            (Pr, "YY-Y--"),
            (Pw, "YY----"),
            (Ex, "Y-----"),
        ];
        for (held, row) in rows {
            for (asked, cell) in Mode::ALL.iter().zip(row.chars()) {
                assert_eq!(held.compatible(*asked), cell == 'Y', "{held} vs {asked}");
                assert_eq!(held.compatible(*asked), asked.compatible(held), "symmetric");
            }
        }
    }

    #[test]
    fn down_and_up_conversions() {
        assert!(Pr.is_down_from(Ex));
        assert!(Cr.is_down_from(Pw));
        assert!(Cw.is_down_from(Pw));
        assert!(Nl.is_down_from(Ex));
        assert!(Ex.is_down_from(Ex));
        assert!(!Ex.is_down_from(Pr));
        assert!(!Pw.is_down_from(Cr));
        assert!(!Pr.is_down_from(Cw), "CW to PR is an up-conversion");
        assert!(!Cw.is_down_from(Pr), "and so is PR to CW");
    }
}
