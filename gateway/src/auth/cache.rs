//! A small bounded TTL cache with coalescing of concurrent identical look-ups, shared by the
//! TokenReview and SubjectAccessReview clients.
//!
//! Why this shape: a review costs a round trip to the core, and a busy client sends the same
//! token (or asks the same question) many times a second. Lookups take a shard's read lock for a
//! hash-map probe and nothing else; no lock is ever held across an `.await`. Keys are SHA-256
//! digests, so a bearer token is never stored, only its hash.
//!
//! Time comes from `tokio::time::Instant`, so tests can pause and advance the clock.

use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::OnceCell;
use tokio::time::Instant;

/// A cache key: the SHA-256 of whatever identifies the question (a token, a review spec).
pub type Key = [u8; 32];

pub fn key_of(bytes: &[u8]) -> Key {
    Sha256::digest(bytes).into()
}

const SHARDS: usize = 16;

/// The keys are already uniformly distributed digests: hashing them again is wasted work.
#[derive(Default, Clone, Copy)]
struct DigestHasher(u64);

// === impl DigestHasher ===

impl Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Called once with the 32 key bytes (plus a length prefix for arrays we ignore).
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.0 ^= u64::from_le_bytes(b);
        }
    }
}

#[derive(Default, Clone, Copy)]
struct DigestState;

// === impl DigestState ===

impl BuildHasher for DigestState {
    type Hasher = DigestHasher;
    fn build_hasher(&self) -> DigestHasher {
        DigestHasher(0)
    }
}

struct Entry<V> {
    value: V,
    expires: Instant,
}

type Shard<V> = RwLock<HashMap<Key, Entry<V>, DigestState>>;
type Flight<V, E> = Arc<OnceCell<Result<V, E>>>;

/// Bounded TTL cache. Each entry carries its own TTL (successes and failures are kept for
/// different times).
pub struct TtlCache<V, E = ()> {
    shards: Box<[Shard<V>]>,
    per_shard: usize,
    /// Look-ups under way, so concurrent misses for one key make one call.
    in_flight: Mutex<HashMap<Key, Flight<V, E>, DigestState>>,
}

// === impl TtlCache ===

impl<V: Clone, E: Clone> TtlCache<V, E> {
    /// `capacity` entries at most (rounded up to a multiple of the shard count).
    pub fn new(capacity: usize) -> Self {
        let per_shard = capacity.div_ceil(SHARDS).max(1);
        Self {
            shards: (0..SHARDS)
                .map(|_| RwLock::new(HashMap::with_hasher(DigestState)))
                .collect(),
            per_shard,
            in_flight: Mutex::new(HashMap::with_hasher(DigestState)),
        }
    }

    fn shard(&self, key: &Key) -> &Shard<V> {
        &self.shards[key[0] as usize % SHARDS]
    }

    /// The cached value, if present and not expired.
    pub fn get(&self, key: &Key) -> Option<V> {
        let shard = self.shard(key).read().unwrap_or_else(|e| e.into_inner());
        shard
            .get(key)
            .filter(|e| e.expires > Instant::now())
            .map(|e| e.value.clone())
    }

    /// Stores `value` for `ttl` (a zero TTL stores nothing). When the shard is full, expired
    /// entries go first, then an arbitrary one: simple, and good enough for a cache whose misses
    /// only cost a review.
    pub fn insert(&self, key: Key, value: V, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut shard = self.shard(&key).write().unwrap_or_else(|e| e.into_inner());
        if shard.len() >= self.per_shard && !shard.contains_key(&key) {
            shard.retain(|_, e| e.expires > now);
            if shard.len() >= self.per_shard {
                if let Some(victim) = shard.keys().next().copied() {
                    shard.remove(&victim);
                }
            }
        }
        shard.insert(
            key,
            Entry {
                value,
                expires: now + ttl,
            },
        );
    }

    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.read().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The cached value, or the result of `fetch`, which runs once however many callers ask for
    /// the same key at the same time. `ttl` decides how long a fetched value is kept (by value:
    /// allowed and denied answers live for different times). Errors are shared with the callers
    /// waiting at that moment but never cached. If the caller running `fetch` goes away (its
    /// client disconnected), one of the waiting callers takes over.
    pub async fn get_or_fetch<F, Fut>(
        &self,
        key: Key,
        ttl: impl Fn(&V) -> Duration,
        fetch: F,
    ) -> Result<V, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<V, E>>,
    {
        if let Some(v) = self.get(&key) {
            return Ok(v);
        }
        let flight = {
            let mut in_flight = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
            in_flight.entry(key).or_default().clone()
        };
        flight
            .get_or_init(|| async {
                // Removes the in-flight marker however this ends, cancellation included, so an
                // abandoned look-up cannot linger in the map.
                let _done = ForgetFlight {
                    in_flight: &self.in_flight,
                    key,
                    flight: &flight,
                };
                // A flight that ended between our cache miss and joining the map has stored
                // its value already: use it instead of reviewing the same token again.
                if let Some(v) = self.get(&key) {
                    return Ok(v);
                }
                let result = fetch().await;
                if let Ok(v) = &result {
                    self.insert(key, v.clone(), ttl(v));
                }
                result
            })
            .await
            .clone()
    }
}

struct ForgetFlight<'a, V, E> {
    in_flight: &'a Mutex<HashMap<Key, Flight<V, E>, DigestState>>,
    key: Key,
    flight: &'a Flight<V, E>,
}

// === impl ForgetFlight ===

impl<V, E> Drop for ForgetFlight<'_, V, E> {
    fn drop(&mut self) {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        if in_flight
            .get(&self.key)
            .is_some_and(|f| Arc::ptr_eq(f, self.flight))
        {
            in_flight.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test(start_paused = true)]
    async fn entries_expire_after_their_own_ttl() {
        let cache: TtlCache<bool> = TtlCache::new(100);
        cache.insert(key_of(b"ok"), true, Duration::from_secs(120));
        cache.insert(key_of(b"bad"), false, Duration::from_secs(10));
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(cache.get(&key_of(b"ok")), Some(true));
        assert_eq!(cache.get(&key_of(b"bad")), Some(false));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(cache.get(&key_of(b"bad")), None);
        assert_eq!(cache.get(&key_of(b"ok")), Some(true));
        tokio::time::advance(Duration::from_secs(110)).await;
        assert_eq!(cache.get(&key_of(b"ok")), None);
    }

    #[tokio::test]
    async fn size_is_bounded() {
        let cache: TtlCache<u32> = TtlCache::new(64);
        for i in 0..1000u32 {
            cache.insert(key_of(&i.to_le_bytes()), i, Duration::from_secs(60));
        }
        assert!(cache.len() <= 64, "{}", cache.len());
        // The newest entry is always kept.
        assert_eq!(cache.get(&key_of(&999u32.to_le_bytes())), Some(999));
    }

    #[tokio::test(start_paused = true)]
    async fn fetch_results_are_cached_and_errors_are_not() {
        let cache: TtlCache<u32, String> = TtlCache::new(10);
        let calls = AtomicUsize::new(0);
        let fetch = || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(7)
        };
        let ttl = |_: &u32| Duration::from_secs(5);
        assert_eq!(cache.get_or_fetch(key_of(b"k"), ttl, fetch).await, Ok(7));
        assert_eq!(cache.get_or_fetch(key_of(b"k"), ttl, fetch).await, Ok(7));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(cache.get_or_fetch(key_of(b"k"), ttl, fetch).await, Ok(7));
        assert_eq!(calls.load(Ordering::SeqCst), 2);

        let failing = || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err::<u32, _>("down".to_string())
        };
        assert!(cache
            .get_or_fetch(key_of(b"e"), ttl, failing)
            .await
            .is_err());
        assert!(cache
            .get_or_fetch(key_of(b"e"), ttl, failing)
            .await
            .is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_misses_are_coalesced() {
        let cache: Arc<TtlCache<u32, String>> = Arc::new(TtlCache::new(10));
        let calls = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..20 {
            let cache = cache.clone();
            let calls = calls.clone();
            tasks.push(tokio::spawn(async move {
                cache
                    .get_or_fetch(
                        key_of(b"same"),
                        |_| Duration::from_secs(60),
                        || async {
                            calls.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            Ok(1)
                        },
                    )
                    .await
            }));
        }
        for t in tasks {
            assert_eq!(t.await.unwrap(), Ok(1));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert!(cache.in_flight.lock().unwrap().is_empty());
    }
}
