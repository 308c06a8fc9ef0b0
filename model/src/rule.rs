//! The wait rule the model runs: the sound one, or one of its broken twins.

use crate::{property, Config};

/// Which wait rule the server and the clients follow.
///
/// [`Rule::Sound`] is the rule as the model says it must be coded (see the
/// crate docs). Every other variant breaks it in one place, the way a plausible
/// implementation (or DESIGN §4 read literally) would, and
/// [`Rule::breaks`] names the property the checker then finds violated: each
/// property is shown to catch something.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    /// The rule the model checks.
    Sound,
    /// A removal or change wakes every waiter of the resource, not just
    /// those that waited on that entry: the thundering herd.
    WakeEveryWaiter,
    /// A waiter wakes on any change of the entry it waits on (a request
    /// granted in the mode it asked for, a conversion's mark), not only when
    /// that entry is gone or no longer blocks it.
    WakeOnAnyChange,
    /// A request is granted when compatible with every *granted* entry,
    /// wherever it stands: a compatible newcomer overtakes an earlier
    /// incompatible request that still waits.
    BypassWaiters,
    /// Conversion deadlocks are not detected: both conversions wait.
    NoDeadlockDetection,
    /// The Linux DLM's check in place of the cycle search (before the mark
    /// and after it): a conversion fails when another granted entry converts
    /// (after the read before the mark: was marked earlier) to a mode its
    /// own granted mode blocks, while that entry's granted mode blocks it.
    /// It misses a cycle that runs through a waiting request.
    PairwiseDeadlockDetection,
    /// Of the conversions on a cycle, the one marked *first* gives up (on a
    /// read after its mark), instead of the one marked last. The first may
    /// have made that read before the cycle closed, and sleeps.
    EarliestMarkGivesUp,
    /// A conversion on a read after its mark gives up only when it was
    /// marked after *every* conversion that lies on a cycle with it
    /// (`View::last_marked_on_cycle` as first coded), instead of when it
    /// lies on a cycle whose other conversions were all marked before it.
    /// Deferring to a later mark that closed another cycle, it sleeps on a
    /// cycle its own mark closed once that later conversion gives up.
    DeferToAnyLaterMark,
    /// Every conversion that finds itself on a cycle on a read after its mark
    /// gives up, not only the one marked last: a conversion whose cycle
    /// another conversion has already given up on fails too.
    EveryConversionOnCycleGivesUp,
    /// A conversion that gives up after its mark (a deadlock) returns without
    /// taking its mark back.
    KeepMarkOnDeadlock,
    /// An up-conversion that its read before the mark shows unblocked is
    /// granted from that read, in one write conditioned on the entries of
    /// that read, without a mark: a request appended after the read is in
    /// no condition, and is granted beside it.
    GrantBeforeMark,
    /// An up-conversion's grant writes its own entry only, not also the
    /// other entries converting to a mode its new one conflicts with (the
    /// code before `ff6351e`). A conversion whose grant was decided on a
    /// read that missed an entry appended after it keeps its condition
    /// when that entry, granted beside the mark, converts up (a conversion
    /// counts a granted entry by the mode it holds): both are granted.
    ConversionGrantLeavesOthers,
    /// A PW or EX grant writes its own entry only, not also the earlier
    /// entries that still wait or convert (the code before `d6caaca`): a
    /// conversion outside PW and EX whose grant was decided on a read
    /// showing a lost holder's name clears the block after a later PW
    /// request was granted and named in it.
    WriterGrantLeavesPending,
    /// An up-conversion to a writing mode keeps the token the entry was
    /// granted with.
    KeepTokenOnConversion,
    /// A request's fencing token is its entry's creation order (etcd's create
    /// revision) instead of a fresh one when it is granted.
    TokenAtAppend,
    /// A waiter that wakes takes the lock without reading the queue again.
    GrantOnWake,
    /// DESIGN §4's up-conversion row as written: granted when compatible with
    /// every granted entry, ahead of earlier requests that still wait.
    ConversionPassesEarlierWaiters,
    /// DESIGN §4's request row as written: a converting entry counts with its
    /// new mode only (not also with the mode it still holds).
    ConvertingCountsNewModeOnly,
    /// A waiter wakes only when the entry it waits on is removed, not when
    /// that entry changes mode (a down-conversion, a conversion given up or
    /// granted).
    WakeOnRemovalOnly,
    /// The server knows an append's attempt only by the entry it made: a
    /// retried append that arrives after its attempt was cancelled (or its
    /// lock released) makes a new entry.
    ForgetAttempts,
    /// The hand-over's write is conditioned on the releaser's own entry and
    /// the entries it grants, not on the entries earlier than those: a
    /// holder ahead that converts up between the release's read and its
    /// write is granted beside the request handed the lock.
    HandOverUnconditionedEarlier,
    /// The hand-over's walk counts only granted (and converting) entries: a
    /// later request is handed the lock past an earlier waiting request it
    /// conflicts with.
    HandOverPastWaiters,
    /// The hand-over's token is the revision the release read (an etcd
    /// read's header revision), not the revision of its write: a request
    /// appended after the read and granted at once beside the lock handed
    /// over (CR beside PW) takes a higher token first.
    HandOverTokenAtRead,
    /// The hand-over grants `try_` requests too (no "hand me the lock" flag),
    /// and a try that finds itself blocked removes its entry without
    /// writing the value block: a PW or EX try handed the lock leaves the
    /// block naming an entry its owner removed.
    HandOverToTry,
    /// A cancelled request's removal of its entry does not write the value
    /// block, though a hand-over may have granted the entry (and named it
    /// in the block) before the cancel.
    CancelKeepsBlockName,
}

impl Rule {
    /// Every broken twin of the sound rule.
    pub const BROKEN: [Rule; 24] = [
        Rule::WakeEveryWaiter,
        Rule::WakeOnAnyChange,
        Rule::BypassWaiters,
        Rule::NoDeadlockDetection,
        Rule::PairwiseDeadlockDetection,
        Rule::EarliestMarkGivesUp,
        Rule::DeferToAnyLaterMark,
        Rule::EveryConversionOnCycleGivesUp,
        Rule::KeepMarkOnDeadlock,
        Rule::GrantBeforeMark,
        Rule::ConversionGrantLeavesOthers,
        Rule::WriterGrantLeavesPending,
        Rule::KeepTokenOnConversion,
        Rule::TokenAtAppend,
        Rule::GrantOnWake,
        Rule::ConversionPassesEarlierWaiters,
        Rule::ConvertingCountsNewModeOnly,
        Rule::WakeOnRemovalOnly,
        Rule::ForgetAttempts,
        Rule::HandOverUnconditionedEarlier,
        Rule::HandOverPastWaiters,
        Rule::HandOverTokenAtRead,
        Rule::HandOverToTry,
        Rule::CancelKeepsBlockName,
    ];

    /// The configuration in which a broken twin is shown to violate
    /// [`Rule::breaks`] (`None` for [`Rule::Sound`]). The sound rule keeps
    /// every property in it.
    pub fn shown_on(self) -> Option<Config> {
        Some(match self {
            Rule::Sound => return None,
            Rule::WakeEveryWaiter | Rule::WakeOnAnyChange | Rule::GrantOnWake | Rule::ForgetAttempts => Config::mutex(),
            Rule::BypassWaiters => Config::read_write(),
            Rule::NoDeadlockDetection
            | Rule::EarliestMarkGivesUp
            | Rule::EveryConversionOnCycleGivesUp
            | Rule::KeepMarkOnDeadlock => Config::conversion_deadlock(),
            Rule::PairwiseDeadlockDetection => Config::conversion_cycle(),
            Rule::DeferToAnyLaterMark => Config::three_conversions(),
            Rule::KeepTokenOnConversion | Rule::TokenAtAppend | Rule::GrantBeforeMark => Config::conversion_token(),
            Rule::ConversionPassesEarlierWaiters => Config::conversion_behind_waiter(),
            Rule::ConversionGrantLeavesOthers => Config::conversion_beside_later_conversion(),
            Rule::WriterGrantLeavesPending => Config::conversion_clears_block(),
            Rule::ConvertingCountsNewModeOnly => Config::sideways_conversion(),
            Rule::WakeOnRemovalOnly => Config::down_conversion(),
            Rule::HandOverUnconditionedEarlier => Config::hand_over_past_conversion(),
            Rule::HandOverPastWaiters | Rule::HandOverToTry => Config::hand_over_past_try(),
            Rule::CancelKeepsBlockName => Config::mutex(),
            Rule::HandOverTokenAtRead => Config::hand_over_token(),
        })
    }

    /// The property a broken twin violates (`None` for [`Rule::Sound`]).
    pub fn breaks(self) -> Option<&'static str> {
        Some(match self {
            Rule::Sound => return None,
            Rule::WakeEveryWaiter | Rule::WakeOnAnyChange => property::HERD_FREE,
            Rule::BypassWaiters => property::NO_BYPASS,
            Rule::NoDeadlockDetection
            | Rule::PairwiseDeadlockDetection
            | Rule::EarliestMarkGivesUp
            | Rule::DeferToAnyLaterMark => property::DEADLOCK_DETECTED,
            Rule::EveryConversionOnCycleGivesUp => property::NO_FALSE_DEADLOCK,
            Rule::KeepMarkOnDeadlock => property::NO_STRAY_MARK,
            Rule::GrantBeforeMark | Rule::ConversionGrantLeavesOthers => property::EXCLUSION,
            Rule::KeepTokenOnConversion => property::FENCED,
            Rule::TokenAtAppend => property::LIVE_WRITES_ACCEPTED,
            Rule::GrantOnWake => property::EXCLUSION,
            Rule::ConversionPassesEarlierWaiters => property::EXCLUSION,
            Rule::ConvertingCountsNewModeOnly => property::EXCLUSION,
            Rule::WakeOnRemovalOnly => property::NO_LOST_WAKEUP,
            Rule::ForgetAttempts => property::NO_ENTRY_LEFT,
            Rule::HandOverUnconditionedEarlier => property::EXCLUSION,
            Rule::HandOverPastWaiters => property::NO_BYPASS,
            Rule::HandOverTokenAtRead => property::TOKENS_RISE,
            Rule::HandOverToTry | Rule::CancelKeepsBlockName => property::BLOCK_LOST_ONLY_BY_LOSS,
            Rule::WriterGrantLeavesPending => property::BLOCK_NAMES_WRITER,
        })
    }
}
