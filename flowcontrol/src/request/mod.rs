//! How much of a server a request takes (kube's `flowcontrol/request`): its width in seats, its
//! seat-seconds, the object counts a LIST is sized by, and the watches a write may wake.

pub mod list_sizes;
pub mod seats;
pub mod watch_tracker;
pub mod width;
