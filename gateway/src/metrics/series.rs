//! The request families' series of one label set, looked up once and kept.
//!
//! Recording a request through prometheus's `with_label_values` SipHashes every label value of
//! every family, five families per request. Here a label set is resolved once into the five
//! series and kept; later requests with the same labels find them with one cheap hash of
//! pointers. The label values are what makes that safe: verb, dry_run, scope, component and
//! system_client are `&'static str` from closed sets, and the four resource names are the
//! `Arc<str>`s discovery's index hands out ([`super::KnownResources`]), which the key holds, so a
//! pointer in a key always means the name it was made from. Only the route target and the code
//! are compared by value (short strings, a number).
//!
//! A new discovery index brings new `Arc`s and so new keys for the same names; the cache is
//! emptied when it reaches [`MAX_SERIES`] entries, which bounds it whatever the churn.

use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::{Arc, RwLock};

use prometheus::{Histogram, IntCounter};

use super::known_resources::ResourceLabels;

/// Label sets kept before the cache starts over (each entry is a few hundred bytes).
pub(super) const MAX_SERIES: usize = 4096;

/// One request's labels, as the cache compares them.
pub struct SeriesKey<'a> {
    pub verb: &'static str,
    pub dry_run: &'static str,
    pub names: &'a ResourceLabels,
    pub scope: &'static str,
    pub component: &'static str,
    pub system_client: &'static str,
    pub target: &'a str,
    pub code: u16,
}

/// The series a request with one label set is recorded in.
pub struct Series {
    pub requests: IntCounter,
    pub duration: Histogram,
    pub sli_duration: Histogram,
    pub gateway_requests: IntCounter,
    pub gateway_duration: Histogram,
}

/// A kept key: the same labels, owned.
struct OwnedKey {
    statics: [&'static str; 5],
    names: ResourceLabels,
    target: Box<str>,
    code: u16,
}

impl OwnedKey {
    fn matches(&self, key: &SeriesKey<'_>) -> bool {
        let same = |a: &str, b: &str| std::ptr::eq(a, b);
        let statics = statics(key);
        self.code == key.code
            && self
                .statics
                .iter()
                .zip(statics.iter())
                .all(|(a, b)| same(a, b))
            && Arc::ptr_eq(&self.names.group, &key.names.group)
            && Arc::ptr_eq(&self.names.version, &key.names.version)
            && Arc::ptr_eq(&self.names.resource, &key.names.resource)
            && Arc::ptr_eq(&self.names.subresource, &key.names.subresource)
            && *self.target == *key.target
    }
}

fn statics(key: &SeriesKey<'_>) -> [&'static str; 5] {
    [
        key.verb,
        key.dry_run,
        key.scope,
        key.component,
        key.system_client,
    ]
}

/// The kept series, by a hash of their key's pointers, target and code.
#[derive(Default)]
pub struct SeriesCache {
    entries: RwLock<Entries>,
    hasher: foldhash::fast::FixedState,
}

#[derive(Default)]
struct Entries {
    /// Hash → the series with that hash (almost always one).
    by_hash: std::collections::HashMap<u64, Vec<(OwnedKey, Series)>, PassThrough>,
    len: usize,
}

impl SeriesCache {
    /// Records with the series of `key`, resolving them with `resolve` the first time.
    pub fn with<R>(
        &self,
        key: &SeriesKey<'_>,
        resolve: impl FnOnce() -> Series,
        record: impl FnOnce(&Series) -> R,
    ) -> R {
        let hash = self.hash(key);
        {
            let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
            if let Some(series) = entries.find(hash, key) {
                return record(series);
            }
        }
        let series = resolve();
        let recorded = record(&series);
        let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
        if entries.len >= MAX_SERIES {
            *entries = Entries::default();
        }
        if entries.find(hash, key).is_none() {
            let owned = OwnedKey {
                statics: statics(key),
                names: key.names.clone(),
                target: key.target.into(),
                code: key.code,
            };
            entries
                .by_hash
                .entry(hash)
                .or_default()
                .push((owned, series));
            entries.len += 1;
        }
        recorded
    }

    fn hash(&self, key: &SeriesKey<'_>) -> u64 {
        let mut h = self.hasher.build_hasher();
        for s in statics(key) {
            h.write_usize(s.as_ptr() as usize);
        }
        for name in [
            &key.names.group,
            &key.names.version,
            &key.names.resource,
            &key.names.subresource,
        ] {
            h.write_usize(Arc::as_ptr(name) as *const u8 as usize);
        }
        key.target.hash(&mut h);
        h.write_u16(key.code);
        h.finish()
    }
}

impl Entries {
    fn find(&self, hash: u64, key: &SeriesKey<'_>) -> Option<&Series> {
        self.by_hash
            .get(&hash)?
            .iter()
            .find(|(k, _)| k.matches(key))
            .map(|(_, series)| series)
    }
}

/// The map's keys are hashes already.
#[derive(Clone, Copy, Default)]
struct PassThrough;

impl BuildHasher for PassThrough {
    type Hasher = PassThroughHasher;
    fn build_hasher(&self) -> PassThroughHasher {
        PassThroughHasher(0)
    }
}

struct PassThroughHasher(u64);

impl Hasher for PassThroughHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}
