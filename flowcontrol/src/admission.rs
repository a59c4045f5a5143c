//! The one decision API Priority and Fairness makes for a request, at each step that makes it:
//! the queue set ([`crate::fairqueuing::queueset`]), the priority level's dispatch
//! ([`crate::fairqueuing::dispatch`]), [`crate::FlowControl::admit`], and the gateway's filter.
//! Each step carries its own payload in the same three answers.

/// Run now, wait in a queue, or be refused.
#[derive(Debug)]
pub enum Admission<R, W, X> {
    /// Its seats are taken: serve it, and give them back when it is done.
    Run(R),
    /// Queued: it waits for its seats, or for a refusal.
    Wait(W),
    /// Refused (a 429).
    Reject(X),
}
