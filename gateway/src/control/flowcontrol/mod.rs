//! Where API Priority and Fairness (the `gateway-flowcontrol` crate) gets its configuration:
//! the core's FlowSchemas and PriorityLevelConfigurations, followed with watches, or kube's
//! built-in objects of the core's release.

pub mod source;
