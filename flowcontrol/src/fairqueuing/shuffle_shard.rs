//! Shuffle sharding (k8s.io/apiserver `pkg/util/shufflesharding`) and the flow hash that feeds it
//! (`hashFlowID` in `apf_controller.go`).
//!
//! Each flow (a FlowSchema and a distinguisher, such as the user) is dealt a *hand* of queues out
//! of its priority level's *deck*, from its hash; a request then goes to the least loaded queue of
//! its hand. Two flows rarely share a whole hand, so one flow filling its queues leaves another
//! flow at least one queue of its own. The deal must be kube's own, card for card: a
//! kube-apiserver and a gateway beside it then put the same flows together, and the dumps read the
//! same.

use std::collections::HashMap;

use sha2::{Digest, Sha256};

/// Only this many bits of the hash are used, so that the last card of a deal is not biased by
/// more than 32:33 (kube's `MaxHashBits`).
pub const MAX_HASH_BITS: u32 = 60;
/// kube's limit on the deck: larger decks are impractical.
const MAX_DECK: u32 = 1 << 26;
/// The largest hand the entropy allows (a deck of 2 cards needs one bit per card).
const MAX_HAND: usize = MAX_HASH_BITS as usize;

/// The bits of hash a deal of `hand` cards from `deck` consumes, rounded up (kube's
/// `RequiredEntropyBits`). Meaningful for `1 <= hand <= deck <= 1 << 26`.
pub fn required_entropy_bits(deck: u32, hand: u32) -> u32 {
    (f64::from(deck).log2() * f64::from(hand)).ceil() as u32
}

/// Deals hands of a fixed size from a deck of a fixed size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dealer {
    deck: u32,
    hand: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DealerError {
    #[error("deckSize {deck} or handSize {hand} is not positive")]
    NotPositive { deck: i64, hand: i64 },
    #[error("handSize {hand} is greater than deckSize {deck}")]
    HandLargerThanDeck { deck: u32, hand: u32 },
    #[error("deckSize {0} is impractically large")]
    DeckTooLarge(u32),
    #[error("required entropy bits of deckSize {deck} and handSize {hand} is greater than {MAX_HASH_BITS}")]
    TooMuchEntropy { deck: u32, hand: u32 },
}

impl Dealer {
    /// kube's `NewDealer`, with its checks and its messages.
    pub fn new(deck: i64, hand: i64) -> Result<Self, DealerError> {
        if deck <= 0 || hand <= 0 {
            return Err(DealerError::NotPositive { deck, hand });
        }
        if hand > deck {
            return Err(DealerError::HandLargerThanDeck {
                deck: deck as u32,
                hand: hand as u32,
            });
        }
        if deck > i64::from(MAX_DECK) {
            return Err(DealerError::DeckTooLarge(deck as u32));
        }
        let (deck, hand) = (deck as u32, hand as u32);
        if required_entropy_bits(deck, hand) > MAX_HASH_BITS {
            return Err(DealerError::TooMuchEntropy { deck, hand });
        }
        Ok(Self { deck, hand })
    }

    pub fn hand_size(&self) -> usize {
        self.hand as usize
    }

    /// Deals a hand from `hash` into `out` (at least [`Dealer::hand_size`] long) and returns the
    /// dealt part. Each card is in `0..deck` and no card is dealt twice.
    ///
    /// The hash is read as a mixed-radix number: digit `i` (radix `deck - i`) picks among the
    /// cards still in the deck, which is then renumbered by skipping the cards already dealt.
    pub fn deal<'a>(&self, mut hash: u64, out: &'a mut [usize; MAX_HAND]) -> &'a [usize] {
        let hand = self.hand as usize;
        let mut remainders = [0u64; MAX_HAND];
        for (i, r) in remainders.iter_mut().enumerate().take(hand) {
            let radix = u64::from(self.deck) - i as u64;
            *r = hash % radix;
            hash /= radix;
        }
        for i in 0..hand {
            let mut card = remainders[i];
            for j in (1..=i).rev() {
                if card >= remainders[j - 1] {
                    card += 1;
                }
            }
            out[i] = card as usize;
        }
        &out[..hand]
    }
}

/// The room a deal needs (see [`Dealer::deal`]).
pub type Hand = [usize; MAX_HAND];

/// A flow's hash: the first 8 bytes (little-endian) of SHA-256 over the FlowSchema's name, a zero
/// byte, and the distinguisher.
pub fn hash_flow_id(flow_schema: &str, distinguisher: &str) -> u64 {
    let mut h = Sha256::new();
    h.update(flow_schema.as_bytes());
    h.update([0u8]);
    h.update(distinguisher.as_bytes());
    let sum = h.finalize();
    u64::from_le_bytes(sum[..8].try_into().expect("a SHA-256 sum has 32 bytes"))
}

/// Flows remembered per FlowSchema: the distinguishers of a busy server are few (its clients'
/// users and namespaces) while SHA-256 costs thousands of instructions per request.
const MAX_REMEMBERED_FLOWS: usize = 1024;
/// Longer distinguishers are hashed every time rather than kept: names and namespaces are at
/// most 253 bytes, so only a made-up one is longer.
const MAX_REMEMBERED_DISTINGUISHER: usize = 253;

/// [`hash_flow_id`] for one FlowSchema, remembered per distinguisher. The hashes are kube's
/// (so are the queues they choose); the set is emptied when it is full, which bounds it
/// whatever the churn of users or namespaces.
pub struct FlowHashes {
    flow_schema: std::sync::Arc<str>,
    known: std::sync::RwLock<HashMap<Box<str>, u64, foldhash::fast::FixedState>>,
}

impl FlowHashes {
    pub fn new(flow_schema: std::sync::Arc<str>) -> Self {
        Self {
            flow_schema,
            known: Default::default(),
        }
    }

    /// The hash of the flow of `distinguisher` in this FlowSchema.
    pub fn get(&self, distinguisher: &str) -> u64 {
        let known = self.known.read().unwrap_or_else(|e| e.into_inner());
        if let Some(hash) = known.get(distinguisher) {
            return *hash;
        }
        drop(known);
        let hash = hash_flow_id(&self.flow_schema, distinguisher);
        if distinguisher.len() <= MAX_REMEMBERED_DISTINGUISHER {
            let mut known = self.known.write().unwrap_or_else(|e| e.into_inner());
            if known.len() >= MAX_REMEMBERED_FLOWS {
                known.clear();
            }
            known.insert(distinguisher.into(), hash);
        }
        hash
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn deal(dealer: &Dealer, hash: u64) -> Vec<usize> {
        let mut hand = [0; MAX_HAND];
        dealer.deal(hash, &mut hand).to_vec()
    }

    /// Deals computed by kube's own `shufflesharding.Dealer.DealIntoHand` and `hashFlowID`
    /// (k8s.io/apiserver v0.33, run once with Go), so that a gateway and a kube-apiserver put the
    /// same flows into the same queues.
    #[test]
    fn deals_and_flow_hashes_are_the_ones_kube_computes() {
        let cases: &[(i64, i64, u64, &[usize])] = &[
            (128, 6, 0, &[0, 1, 2, 3, 4, 5]),
            (128, 6, 1, &[1, 0, 2, 3, 4, 5]),
            (128, 6, 0x0123_4567_89ab_cdef, &[111, 33, 73, 64, 85, 1]),
            (64, 6, 0x0fff_ffff_ffff_ffff, &[63, 0, 16, 6, 61, 28]),
            (16, 4, 12_345_678_901, &[5, 12, 2, 3]),
            (6, 6, 42, &[0, 3, 2, 1, 4, 5]),
            // alice's flow in global-default (the hash below).
            (128, 6, 0xf4de_3bd4_2ccd_f6b7, &[55, 62, 126, 125, 105, 1]),
        ];
        for (deck, hand, hash, want) in cases {
            let dealer = Dealer::new(*deck, *hand).unwrap();
            assert_eq!(
                deal(&dealer, *hash),
                *want,
                "deck {deck} hand {hand} hash {hash:#x}"
            );
        }
        assert_eq!(
            hash_flow_id("global-default", "alice"),
            0xf4de_3bd4_2ccd_f6b7
        );
        assert_eq!(
            hash_flow_id("service-accounts", "system:serviceaccount:quiet:reader"),
            0x6a0f_db9d_0419_8c7c
        );
        assert_eq!(hash_flow_id("", ""), 0x987a_b3ff_9c0b_346e);
    }

    #[test]
    fn remembered_flow_hashes_are_kubes() {
        let hashes = FlowHashes::new("global-default".into());
        for _ in 0..2 {
            assert_eq!(hashes.get("alice"), 0xf4de_3bd4_2ccd_f6b7);
        }
        // Past the bound the set starts over; every answer is still the flow's own hash.
        for i in 0..MAX_REMEMBERED_FLOWS + 10 {
            let user = format!("user-{i}");
            assert_eq!(hashes.get(&user), hash_flow_id("global-default", &user));
        }
        assert!(hashes.known.read().unwrap().len() <= MAX_REMEMBERED_FLOWS);
        let long = "n".repeat(MAX_REMEMBERED_DISTINGUISHER + 1);
        assert_eq!(hashes.get(&long), hash_flow_id("global-default", &long));
        assert!(!hashes.known.read().unwrap().contains_key(long.as_str()));
        assert_eq!(hashes.get("alice"), 0xf4de_3bd4_2ccd_f6b7);
    }

    #[test]
    fn dealers_are_refused_as_kube_refuses_them() {
        let err = |deck, hand| Dealer::new(deck, hand).unwrap_err().to_string();
        assert_eq!(err(-100, 8), "deckSize -100 or handSize 8 is not positive");
        assert_eq!(err(100, 0), "deckSize 100 or handSize 0 is not positive");
        assert_eq!(err(100, 101), "handSize 101 is greater than deckSize 100");
        assert_eq!(err(1 << 27, 2), "deckSize 134217728 is impractically large");
        assert_eq!(
            err(512, 8),
            "required entropy bits of deckSize 512 and handSize 8 is greater than 60"
        );
        assert!(Dealer::new(1024, 6).is_ok());
        assert_eq!(required_entropy_bits(1024, 6), 60);
        assert_eq!(required_entropy_bits(512, 8), 72);
    }

    #[test]
    fn a_hand_never_repeats_a_card_and_stays_in_the_deck() {
        for (deck, hand) in [(4, 4), (8, 8), (12, 12), (128, 8), (256, 7), (512, 6)] {
            let dealer = Dealer::new(deck, hand).unwrap();
            for _ in 0..200 {
                let cards = deal(&dealer, fastrand::u64(..));
                assert_eq!(cards.len(), hand as usize);
                let mut sorted = cards.clone();
                sorted.sort_unstable();
                sorted.dedup();
                assert_eq!(sorted.len(), hand as usize, "{cards:?}");
                assert!(cards.iter().all(|&c| c < deck as usize), "{cards:?}");
            }
        }
    }

    /// Every possible hand of 3 from 50 is dealt equally often by consecutive hashes (kube's
    /// uniformity test, on a deck small enough to enumerate).
    #[test]
    fn consecutive_hashes_deal_every_hand_equally_often() {
        let dealer = Dealer::new(50, 3).unwrap();
        let deals = 50 * 49 * 48;
        let mut seen: HashMap<Vec<usize>, u32> = HashMap::new();
        for hash in 0..deals {
            let mut cards = deal(&dealer, hash);
            cards.sort_unstable();
            *seen.entry(cards).or_default() += 1;
        }
        assert_eq!(seen.len(), 50 * 49 * 48 / 6);
        assert!(seen.values().all(|&n| n == 6));
    }
}
