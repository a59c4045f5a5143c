//! The set one directory read publishes, built name by name: each APIService's definition to
//! route, and every refusal, with the problems to log.
//!
//! A name defined in two places is a mistake the directory cannot settle by itself (two files of
//! a ConfigMap, a copy left behind). Letting the earlier file name win would let a file added
//! later silently take over an API that was working, so the definition that was routed before
//! stays routed (the first in file-name order when neither was), and every other one is refused
//! with an error naming both places, as a refused edit is (see the module docs of `file`).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use tracing::error;

use super::super::{ApiServiceSet, Refusal, SourceError};
use crate::model::APIService;

/// A manifest the source refused, for the log.
#[derive(Debug)]
pub struct Problem {
    /// Names the file, the line where known, and what is wrong.
    pub error: SourceError,
    /// The APIService concerned, when its name could be read; `None` when the file is the unit.
    pub api_service: Option<String>,
    /// How many APIServices stay in force from the last good version (of this APIService, or of
    /// everything the file held).
    pub kept: usize,
}

impl Problem {
    pub(super) fn log(&self) {
        let error = &self.error;
        match (&self.api_service, self.kept) {
            (Some(apiservice), _) if matches!(error, SourceError::Duplicate { .. }) => {
                error!(%error, %apiservice, "APIService defined twice; the routed definition stays in force until one is removed")
            }
            (Some(apiservice), 0) => {
                error!(%error, %apiservice, "APIService manifest refused; the APIService is not routed until the manifest is fixed")
            }
            (Some(apiservice), _) => {
                error!(%error, %apiservice, "APIService manifest refused; its last good version stays in force until the manifest is fixed")
            }
            (None, 0) => {
                error!(%error, "APIService manifest file refused; none of its APIServices are routed until it is fixed")
            }
            (None, kept) => {
                error!(%error, kept, "APIService manifest file refused; the APIServices it last held stay in force until it is fixed")
            }
        }
    }
}

/// The outcome of one directory read.
#[derive(Debug)]
pub struct Loaded {
    /// What to publish: by name, valid APIServices and the last good versions kept for refused
    /// edits; and every refusal (files first, then APIServices by name).
    pub set: ApiServiceSet,
    /// Every problem, for the log: one per refused manifest, also where [`Loaded::set`] carries
    /// one refusal for a name refused in several files.
    pub problems: Vec<Problem>,
}

/// The set being built by `Loader::load`.
#[derive(Default)]
pub(super) struct SetBuilder {
    entries: BTreeMap<String, Entry>,
    /// Refused files, in file-name order, with why.
    files: BTreeMap<PathBuf, String>,
    problems: Vec<Problem>,
}

/// One name's entry in the set being built.
#[derive(Default)]
struct Entry {
    /// Every definition to route (valid, or the last good one of a refused edit), in file-name
    /// order; only one is routed.
    defined: Vec<Defined>,
    /// Why this name's manifest was refused: the first refusal in file-name order.
    refused: Option<String>,
}

/// An APIService definition and where it came from.
struct Defined {
    api: APIService,
    file: PathBuf,
    /// `file:line`, for the duplicate error.
    origin: String,
}

// === impl SetBuilder ===

impl SetBuilder {
    /// Adds a validated APIService (validation requires a name) defined in `file` at `origin`.
    pub(super) fn add(&mut self, api: APIService, file: &Path, origin: String) {
        let Some(name) = api.metadata.name.clone() else {
            return;
        };
        self.entries.entry(name).or_default().defined.push(Defined {
            api,
            file: file.to_owned(),
            origin,
        });
    }

    pub(super) fn refuse_api_service(&mut self, name: String, error: SourceError, kept: bool) {
        let entry = self.entries.entry(name.clone()).or_default();
        entry.refused.get_or_insert_with(|| error.to_string());
        self.problems.push(Problem {
            error,
            api_service: Some(name),
            kept: usize::from(kept),
        });
    }

    pub(super) fn refuse_file(&mut self, path: &Path, error: SourceError, kept: usize) {
        self.files
            .entry(path.to_owned())
            .or_insert_with(|| error.to_string());
        self.problems.push(Problem {
            error,
            api_service: None,
            kept,
        });
    }

    /// The set, with one definition routed per name: the one from `routed_from` (the file each
    /// name was routed from by the last read) where it is still there, else the first. Also
    /// returns where each name is routed from now.
    pub(super) fn finish(
        mut self,
        routed_from: &HashMap<String, PathBuf>,
    ) -> (Loaded, HashMap<String, PathBuf>) {
        let mut refused: Vec<Refusal> = std::mem::take(&mut self.files)
            .into_iter()
            .map(|(path, reason)| Refusal::File { path, reason })
            .collect();
        let mut apiservices = Vec::with_capacity(self.entries.len());
        let mut routed_now = HashMap::with_capacity(self.entries.len());
        for (name, mut entry) in std::mem::take(&mut self.entries) {
            let routed = routed_from
                .get(&name)
                .and_then(|file| entry.defined.iter().position(|d| &d.file == file))
                .unwrap_or(0);
            if entry.defined.len() > 1 {
                let keep = &entry.defined[routed];
                for (i, other) in entry.defined.iter().enumerate() {
                    if i == routed {
                        continue;
                    }
                    let error = SourceError::Duplicate {
                        name: name.clone(),
                        refused: other.origin.clone(),
                        routed: keep.origin.clone(),
                    };
                    entry.refused.get_or_insert_with(|| error.to_string());
                    self.problems.push(Problem {
                        error,
                        api_service: Some(name.clone()),
                        kept: 1,
                    });
                }
            }
            let routed = (!entry.defined.is_empty()).then(|| entry.defined.swap_remove(routed));
            if let Some(reason) = entry.refused {
                refused.push(Refusal::ApiService {
                    name: name.clone(),
                    kept: routed.is_some(),
                    reason,
                });
            }
            if let Some(d) = routed {
                routed_now.insert(name, d.file);
                apiservices.push(d.api);
            }
        }
        let loaded = Loaded {
            set: ApiServiceSet {
                apiservices,
                refused,
            },
            problems: self.problems,
        };
        (loaded, routed_now)
    }
}
