//! The six lock modes of a VMS-style distributed lock manager.

use std::fmt;

/// One of the six lock modes of a distributed lock manager in the VMS
/// tradition (OpenVMS, the Linux kernel's `fs/dlm`), least restrictive
/// first. A [`Resource`](crate::Resource) is locked in one of them.
///
/// | held \ asked | NL | CR | CW | PR | PW | EX |
/// |---|---|---|---|---|---|---|
/// | NL | Y | Y | Y | Y | Y | Y |
/// | CR | Y | Y | Y | Y | Y | – |
/// | CW | Y | Y | Y | – | – | – |
/// | PR | Y | Y | – | Y | – | – |
/// | PW | Y | Y | – | – | – | – |
/// | EX | Y | – | – | – | – | – |
///
/// `Display` and `FromStr` use the short names (`NL` … `EX`; parsing ignores
/// case).
///
/// ```
/// use lockline::LockMode;
/// assert!(LockMode::Pr.compatible(LockMode::Pr));
/// assert!(!LockMode::Pr.compatible(LockMode::Pw));
/// assert_eq!("pw".parse::<LockMode>()?, LockMode::Pw);
/// # Ok::<(), lockline::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LockMode {
    /// Null: holds a place (and sees the value block) without blocking anyone.
    Nl,
    /// Concurrent read: reads beside writers that expect concurrent readers.
    Cr,
    /// Concurrent write: writes beside other concurrent writers and readers.
    Cw,
    /// Protected read: shares the resource with other readers only.
    Pr,
    /// Protected write: one writer, beside concurrent readers only.
    Pw,
    /// Exclusive: nobody else but null holders.
    Ex,
}

impl LockMode {
    /// Every mode, least restrictive first.
    pub const ALL: [LockMode; 6] = [
        LockMode::Nl,
        LockMode::Cr,
        LockMode::Cw,
        LockMode::Pr,
        LockMode::Pw,
        LockMode::Ex,
    ];

    /// Whether a lock in this mode may be granted while another is granted
    /// in `other` (the matrix above; it is symmetric).
    pub fn compatible(self, other: LockMode) -> bool {
        use LockMode::*;
        match (self, other) {
            (Nl, _) | (_, Nl) => true,
            (Cr, Ex) | (Ex, Cr) => false,
            (Cr, _) | (_, Cr) => true,
            (Cw, Cw) | (Pr, Pr) => true,
            _ => false,
        }
    }

    /// Whether converting from `from` to this mode is a down-conversion (or
    /// no change): every mode compatible with `from` is compatible with this
    /// one, so it is granted at once. Anything else is an up-conversion,
    /// CW ⇄ PR included (each excludes something the other admits).
    pub fn is_down_from(self, from: LockMode) -> bool {
        LockMode::ALL.iter().all(|&m| !from.compatible(m) || self.compatible(m))
    }

    /// Whether a holder in this mode may write: CW, PW and EX. A grant or an
    /// up-conversion to one of them takes a fresh fencing token.
    pub fn writes(self) -> bool {
        matches!(self, LockMode::Cw | LockMode::Pw | LockMode::Ex)
    }

    /// Whether this mode excludes every other writer (PW and EX): the modes
    /// that write the lock value block, and whose writes a resource can
    /// fence by "the highest token wins".
    pub fn sole_writer(self) -> bool {
        matches!(self, LockMode::Pw | LockMode::Ex)
    }

    /// The short name: `NL`, `CR`, `CW`, `PR`, `PW` or `EX`.
    pub fn label(self) -> &'static str {
        match self {
            LockMode::Nl => "NL",
            LockMode::Cr => "CR",
            LockMode::Cw => "CW",
            LockMode::Pr => "PR",
            LockMode::Pw => "PW",
            LockMode::Ex => "EX",
        }
    }

    pub(crate) fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

impl fmt::Display for LockMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

#[cfg(test)]
mod tests {
    use super::LockMode::{self, *};

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
            for (asked, cell) in LockMode::ALL.iter().zip(row.chars()) {
                assert_eq!(held.compatible(*asked), cell == 'Y', "{held} vs {asked}");
                assert_eq!(held.compatible(*asked), asked.compatible(held), "symmetric");
            }
        }
    }

    #[test]
    fn down_and_up_conversions() {
        assert!(Pr.is_down_from(Ex));
        assert!(Cr.is_down_from(Pw));
        assert!(Nl.is_down_from(Ex));
        assert!(Ex.is_down_from(Ex));
        assert!(!Ex.is_down_from(Pr));
        assert!(!Pw.is_down_from(Cr));
        assert!(!Pr.is_down_from(Cw));
        assert!(!Cw.is_down_from(Pr));
    }
}
