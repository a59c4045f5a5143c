//! Fixed ports for etcd, kube-apiserver and sample-apiserver, which take their port as a flag.
//!
//! The ports come from below the kernel's ephemeral range (32768–60999 here): kube-apiserver's own
//! outgoing connections to etcd take ephemeral ports, and a fixed port picked inside that range
//! was seen taken by one of them before sample-apiserver could bind it. A candidate is bound once
//! to check it is free, then released for the server; the start is retried on a bind failure by
//! the caller's timeout, not here.

use std::net::{Ipv4Addr, TcpListener};
use std::sync::atomic::{AtomicU16, Ordering};

/// The range ports are picked from: above the well-known ports, below the ephemeral range.
const LOW: u16 = 20000;
const HIGH: u16 = 32000;

/// A port on 127.0.0.1 that was free a moment ago, below the ephemeral range.
///
/// Several test processes run at once, so the walk starts at an offset from the process id and
/// moves on from the last port this process handed out.
///
/// # Panics
/// When no port of the range is free.
pub fn free_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let span = HIGH - LOW;
    let _ = NEXT.compare_exchange(
        0,
        (std::process::id() % u32::from(span)) as u16,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..span {
        let offset = NEXT.fetch_add(7, Ordering::Relaxed) % span;
        let port = LOW + offset;
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return port;
        }
    }
    panic!("no free port on 127.0.0.1 between {LOW} and {HIGH}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_below_the_ephemeral_range_and_distinct() {
        let a = free_port();
        let b = free_port();
        assert!((LOW..HIGH).contains(&a) && (LOW..HIGH).contains(&b));
        assert_ne!(a, b);
    }
}
