//! Classifications remembered per thread: the FlowSchema (and flow hash) of a request is a
//! function of its caller and a few of its attributes under one configuration, and most
//! requests repeat a tuple seen moments ago (a controller's LISTs, a kubelet's lease renewals).
//!
//! The key is everything classification reads: the user's name and groups, whether it is a
//! resource request, the verb, and either the API group, resource, subresource and namespace or
//! the non-resource path. The configuration's generation is not in each entry: a thread that
//! meets a newer configuration forgets everything first, so no entry outlives the schemas it
//! names for longer than that thread's next request.
//!
//! Each thread has its own memory, so a hit touches no shared lock and allocates nothing; only
//! a miss copies the key. The memory is bounded: at [`CAPACITY`] entries it starts over, and a
//! key longer than [`MAX_KEY_BYTES`] is not remembered at all.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;

use gateway_request::identity::UserInfo;
use gateway_request::request_info::RequestInfo;

use crate::controller::Schema;

/// Entries one thread remembers before it starts over.
pub const CAPACITY: usize = 1024;
/// Keys longer than this (all strings together) are classified every time.
pub const MAX_KEY_BYTES: usize = 1024;

/// What a request was classified as.
#[derive(Clone)]
pub struct Classified {
    pub schema: Arc<Schema>,
    /// The flow's hash (0 where flows are not told apart).
    pub flow_hash: u64,
}

#[derive(Default)]
struct Memory {
    generation: u64,
    entries: HashMap<u64, Entry, foldhash::fast::FixedState>,
}

struct Entry {
    key: Key,
    classified: Classified,
}

/// A request's classification attributes, owned.
struct Key {
    user: Box<str>,
    groups: Box<[Box<str>]>,
    resource_request: bool,
    verb: Box<str>,
    /// API group, resource, subresource and namespace; or the path and three empty strings.
    fields: [Box<str>; 4],
}

thread_local! {
    static MEMORY: RefCell<Memory> = RefCell::default();
}

/// The classification of `info` by `user` under configuration `generation`: remembered, or
/// `classify`'s answer (then remembered).
pub fn classified(
    generation: u64,
    user: &UserInfo,
    info: &RequestInfo,
    classify: impl FnOnce() -> Classified,
) -> Classified {
    let fields = fields(info);
    let digest = digest(user, info, &fields);
    let known = MEMORY.with_borrow_mut(|memory| {
        if memory.generation != generation {
            memory.entries.clear();
            memory.generation = generation;
        }
        memory
            .entries
            .get(&digest)
            .filter(|e| e.key.is(user, info, &fields))
            .map(|e| e.classified.clone())
    });
    if let Some(known) = known {
        return known;
    }
    let answer = classify();
    if key_bytes(user, info, &fields) <= MAX_KEY_BYTES {
        let entry = Entry {
            key: Key::of(user, info, &fields),
            classified: answer.clone(),
        };
        MEMORY.with_borrow_mut(|memory| {
            // Another configuration may have come in while `classify` ran: then this thread's
            // memory is already its, and the answer (of the older one) is not kept.
            if memory.generation != generation {
                return;
            }
            if memory.entries.len() >= CAPACITY {
                memory.entries.clear();
            }
            memory.entries.insert(digest, entry);
        });
    }
    answer
}

/// How many classifications this thread remembers (for the tests).
pub fn remembered() -> usize {
    MEMORY.with_borrow(|memory| memory.entries.len())
}

fn fields(info: &RequestInfo) -> [&str; 4] {
    if info.is_resource_request {
        [
            info.api_group(),
            info.resource(),
            info.subresource(),
            info.namespace(),
        ]
    } else {
        [info.path(), "", "", ""]
    }
}

fn digest(user: &UserInfo, info: &RequestInfo, fields: &[&str; 4]) -> u64 {
    let mut h = foldhash::fast::FixedState::default().build_hasher();
    user.name.hash(&mut h);
    user.groups.hash(&mut h);
    info.is_resource_request.hash(&mut h);
    info.verb().hash(&mut h);
    fields.hash(&mut h);
    h.finish()
}

fn key_bytes(user: &UserInfo, info: &RequestInfo, fields: &[&str; 4]) -> usize {
    user.name.len()
        + user.groups.iter().map(String::len).sum::<usize>()
        + info.verb().len()
        + fields.iter().map(|f| f.len()).sum::<usize>()
}

impl Key {
    fn of(user: &UserInfo, info: &RequestInfo, fields: &[&str; 4]) -> Self {
        Self {
            user: user.name.as_str().into(),
            groups: user.groups.iter().map(|g| g.as_str().into()).collect(),
            resource_request: info.is_resource_request,
            verb: info.verb().into(),
            fields: fields.map(Into::into),
        }
    }

    fn is(&self, user: &UserInfo, info: &RequestInfo, fields: &[&str; 4]) -> bool {
        *self.user == *user.name
            && self.resource_request == info.is_resource_request
            && *self.verb == *info.verb()
            && self.groups.len() == user.groups.len()
            && self
                .groups
                .iter()
                .zip(&user.groups)
                .all(|(a, b)| **a == **b)
            && self.fields.iter().zip(fields).all(|(a, b)| **a == **b)
    }
}
