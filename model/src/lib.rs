//! A model of lockline's queue protocol, checked exhaustively with
//! [stateright](https://docs.rs/stateright).
//!
//! (Crate docs to be written.)

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(rustdoc::broken_intra_doc_links)]

mod check;
mod config;
mod mode;
mod model;
pub mod property;
mod rule;
pub mod state;

pub use check::{check, Report};
pub use config::{Config, Op, Patience, Queueing};
pub use mode::Mode;
pub use model::{Action, QueueModel};
pub use rule::Rule;
