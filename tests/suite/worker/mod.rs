//! The delivery worker: claims and their fences (races 1 and 2), fair share and flow control,
//! delivery end to end with signatures, failures, the retry schedule, what receivers
//! answered, the pipeline under load, the state changes it publishes, and recorders in
//! several processes that never deadlock.

mod answers;
mod broken_receivers;
mod claimer;
mod claims;
mod delivery;
mod failures;
mod flow_control;
mod notifications;
mod recording_locks;
mod schedule;
mod success_lock_order;
mod worker_pipeline;
