//! What the core records for metrics when the `metrics` feature is off:
//! nothing. The same names as [`crate::metrics`]'s, empty and inlined away.

use std::sync::Arc;

use crate::sequencer::Mode;
use crate::stats::Counters;
use crate::{EntryKind, Error, SessionState};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    Expired,
    Unconfirmed,
    Deleted,
    RuntimeGone,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum End {
    LetGo,
    Lost(#[allow(dead_code)] Cause),
}

pub(crate) struct SessionGauge;

impl SessionGauge {
    #[inline(always)]
    pub(crate) fn opened(_: Arc<Counters>, _: &'static str) -> Self {
        SessionGauge
    }
    #[inline(always)]
    pub(crate) fn set(&mut self, _: SessionState) {}
    #[inline(always)]
    pub(crate) fn lost_while_suspended(&self) -> bool {
        false
    }
    #[inline(always)]
    pub(crate) fn end(&mut self, _: SessionState, _: bool) {}
}

pub(crate) struct Acquiring;

impl Acquiring {
    #[inline(always)]
    pub(crate) fn start(_: &Counters, _: &'static str, _: EntryKind, _: &str) -> Self {
        Acquiring
    }
    #[inline(always)]
    pub(crate) fn waiting(&self) {}
    #[inline(always)]
    pub(crate) fn woken(&self) {}
    #[inline(always)]
    pub(crate) fn delayed(&self) {}
    #[inline(always)]
    pub(crate) fn granted(&self) {}
    #[inline(always)]
    pub(crate) fn busy(&self) {}
    #[inline(always)]
    pub(crate) fn failed(&self, _: &Error) {}
}

pub(crate) struct Holding;

impl Holding {
    #[inline(always)]
    pub(crate) fn new(_: &Counters, _: &'static str, _: Mode, _: &str) -> Self {
        Holding
    }
    #[inline(always)]
    pub(crate) fn letting_go(&self) {}
    #[inline(always)]
    pub(crate) fn end(&self, _: End) {}
    #[inline(always)]
    pub(crate) fn monitor_gone(&self) {}
}

#[inline(always)]
pub(crate) fn cleanup_retry(_: &Counters, _: &'static str, _: EntryKind) {}

#[inline(always)]
pub(crate) fn cleanup_failure(_: &Counters, _: &'static str, _: EntryKind) {}
