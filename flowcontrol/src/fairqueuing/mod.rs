//! Fair queuing within a priority level (kube's `flowcontrol/fairqueuing`): flows shuffle-sharded
//! into queues, the queue set that serves them by virtual finish time, the dispatch that admits
//! or queues a request, and the integrator of seat demand that lending reads.

pub mod dispatch;
pub mod integrator;
pub mod queueset;
pub mod shuffle_shard;
