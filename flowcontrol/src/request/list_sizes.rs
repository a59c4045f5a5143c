//! How large the answers to LISTs have been, by what they asked for: the gateway's stand-in for
//! the object counts and sizes kube's LIST width estimate reads from its storage
//! (`request/list_work_estimator.go`, `object_count_tracker.go`).
//!
//! kube-apiserver knows how many objects of each resource it stores and their average size; a
//! proxy does not. What it does see is every answer it relays, so it remembers the size of the
//! last answers to each LIST it relayed (by group, resource, namespace and page size) and
//! estimates the next one from them: the bytes a LIST makes the gateway hold and copy are what
//! its seats stand for here.
//!
//! The table is fixed-size and lock-free: one atomic word per slot holds a tag of the key and the
//! smoothed size, so a lookup or a record costs a hash and one atomic access, and a flood of
//! distinct LISTs only evicts entries (their next estimate falls back to one seat).

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

const SLOTS: usize = 4096;

/// A LIST's key in the table (a hash of what it asked for).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListKey(u64);

impl ListKey {
    pub fn new(group: &str, resource: &str, namespace: &str, limit: &[u8]) -> Self {
        let mut h = DefaultHasher::new();
        (group, resource, namespace, limit).hash(&mut h);
        // Never zero: a zero word is an empty slot.
        Self(h.finish() | 1 << 63)
    }

    fn slot(self) -> usize {
        (self.0 as usize) % SLOTS
    }

    fn tag(self) -> u64 {
        self.0 >> 32
    }
}

pub struct ListSizes {
    /// `tag << 32 | KiB`, 0 when empty.
    slots: Box<[AtomicU64]>,
}

impl Default for ListSizes {
    fn default() -> Self {
        Self {
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl ListSizes {
    /// The remembered size of `key`'s answers, in bytes.
    pub fn get(&self, key: ListKey) -> Option<u64> {
        let word = self.slots[key.slot()].load(Ordering::Relaxed);
        (word != 0 && word >> 32 == key.tag()).then(|| (word & 0xffff_ffff) * 1024)
    }

    /// Notes an answer of `bytes` to `key`: averaged with the last one, so one odd answer moves
    /// the estimate halfway.
    pub fn record(&self, key: ListKey, bytes: u64) {
        let kib = bytes.div_ceil(1024).min(u64::from(u32::MAX));
        let smoothed = match self.get(key) {
            Some(prev) => (prev / 1024 + kib).div_ceil(2),
            None => kib,
        };
        // A race with another record of the same slot loses one sample, which is harmless.
        self.slots[key.slot()].store(key.tag() << 32 | smoothed, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_remembered_per_question_and_smoothed() {
        let sizes = ListSizes::default();
        let cms = ListKey::new("", "configmaps", "x", b"");
        let page = ListKey::new("", "configmaps", "x", b"500");
        assert_eq!(sizes.get(cms), None);
        sizes.record(cms, 1_500_000);
        assert_eq!(sizes.get(cms), Some(1_465 * 1024));
        assert_eq!(sizes.get(page), None);
        sizes.record(cms, 500_000);
        // Halfway between the two answers.
        let got = sizes.get(cms).unwrap();
        assert!((990_000..=1_010_000).contains(&got), "{got}");
    }
}
