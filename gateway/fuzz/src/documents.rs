//! apiservice's document fuzz bodies (`apiservice::fuzzing`).

#[path = "../../../apiservice/src/fuzzing/choices.rs"]
pub mod choices;
#[path = "../../../apiservice/src/fuzzing/documents.rs"]
pub mod documents;
