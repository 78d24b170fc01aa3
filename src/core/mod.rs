//! The pure, deterministic core: given an event and an operation's state,
//! decide the new state, the verdicts and the anomalies.
//!
//! Nothing in here performs IO, reads a clock or draws randomness; the
//! imports of this module tree are limited to std, serde, uuid, sha1, itoa,
//! regex, xxhash and postcard. The pipeline, the tests and the benches all
//! drive the same [`apply`].

mod applied;
pub mod deadline;
pub mod detect;
pub mod event;
pub mod ids;
pub mod memory;
mod names;
pub mod operation;
pub mod output;
pub mod policy;
pub mod reason;
pub mod redact;
pub mod trust;
pub mod verdict;

pub use detect::{apply, supersede, Disposition, Step, Supersede};
pub use event::{Body, Event, SourcePos};
pub use operation::{DecisionRefusal, EntityState, FollowUp, OpenOperation, OperationState};
pub use output::{
    Action, Anomaly, AnomalyKind, Escalation, Outcome, Output, RepairAction, RepairCommand, Status, Supersession,
    Verdict,
};
pub use policy::{Policy, TypePolicy};
pub use trust::Authenticity;
