//! The manifest parser: one file's text → the APIServices in it, each accepted or refused on
//! its own, with the file and line of every problem.
//!
//! Files are read the way `kubectl apply -f` reads them: several documents per file (`---`),
//! `kind: List` / `APIServiceList` with `items`, JSON or YAML, documents of other kinds ignored.
//! Decoding is typed as early as possible so serde-saphyr's errors point at the offending line;
//! see [`Doc`] for how, and [`Lenient`] for why one document of an unexpected shape skips that
//! document instead of failing the whole file.

use std::fmt;
use std::marker::PhantomData;
use std::path::Path;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;
use tracing::debug;

use crate::model::{APIService, APIServiceSpec, APIServiceStatus};
use crate::source::SourceError;
use crate::validation::validate;

/// `apiVersion`s an APIService manifest may have; v1beta1 has the same shape.
const API_VERSIONS: [&str; 2] = [
    "apiregistration.k8s.io/v1",
    "apiregistration.k8s.io/v1beta1",
];

/// An APIService found in a file, with the line its document (or List item) starts on.
#[derive(Debug)]
pub struct Found {
    /// `metadata.name`, when it could be read (also for a refused APIService).
    pub name: Option<String>,
    pub line: Option<u64>,
    /// The APIService, or why it is refused (wrong `apiVersion`, a field of the wrong type
    /// before `kind`, a validation error). Errors carry the file and line.
    pub api: Result<APIService, SourceError>,
}

/// Parses one manifest file: YAML (one or more documents) or JSON. APIServices are checked for
/// `apiVersion` and validated, each on its own; other kinds are skipped. The error is for a file
/// that cannot be parsed at all (syntax, or a value of the wrong type in a typed field), with the
/// file and line.
pub fn parse_manifests(path: &Path, text: &str) -> Result<Vec<Found>, SourceError> {
    let options = serde_saphyr::options! { with_snippet: false };
    let docs: Vec<Spanned<Doc>> = serde_saphyr::from_multiple_with_options(text, options)
        .map_err(|e| saphyr_error(path, &e))?;
    let mut found = Vec::new();
    for doc in docs {
        collect(path, doc, &mut found);
    }
    Ok(found)
}

fn collect(path: &Path, doc: Spanned<Doc>, out: &mut Vec<Found>) {
    let line = Some(doc.referenced.line()).filter(|l| *l > 0);
    match doc.value {
        Doc::Other { kind } => {
            debug!(
                file = %path.display(),
                line,
                kind = kind.as_deref().unwrap_or("<none>"),
                "ignoring a document that is not an APIService"
            );
        }
        Doc::List(items) => {
            for item in items {
                collect(path, item, out);
            }
        }
        Doc::ApiService(doc) => {
            let name = doc.name();
            out.push(Found {
                name,
                line,
                api: to_api_service(path, line, *doc),
            });
        }
    }
}

impl ApiServiceDoc {
    /// `metadata.name`, also when `metadata` came before `kind` and is not decoded yet.
    fn name(&self) -> Option<String> {
        if let Some(meta) = &self.metadata {
            return meta.name.clone();
        }
        self.deferred
            .iter()
            .rev()
            .find_map(|(field, value)| match field {
                Deferred::Metadata => value.value.get("name")?.as_str().map(str::to_owned),
                _ => None,
            })
    }
}

fn to_api_service(
    path: &Path,
    line: Option<u64>,
    doc: ApiServiceDoc,
) -> Result<APIService, SourceError> {
    let parse_err = |message: String| SourceError::Parse {
        path: path.to_owned(),
        line,
        column: None,
        message,
    };
    let ApiServiceDoc {
        api_version,
        metadata,
        spec,
        status,
        deferred,
    } = doc;
    match api_version.as_deref() {
        Some(v) if API_VERSIONS.contains(&v) => {}
        Some(v) => {
            return Err(parse_err(format!(
                "kind APIService with apiVersion {v:?}: expected {:?}",
                API_VERSIONS[0]
            )))
        }
        None => {
            return Err(parse_err(format!(
                "kind APIService without apiVersion: expected {:?}",
                API_VERSIONS[0]
            )))
        }
    }
    let mut api = APIService {
        metadata: metadata.unwrap_or_default(),
        spec,
        status,
    };
    // Fields that came before `kind` in the document were kept as generic values; decode
    // them now. serde_json knows no lines, so point at where the field's value starts.
    for (field, value) in deferred {
        let at = Some(value.referenced.line()).filter(|l| *l > 0);
        let err = |e: serde_json::Error| SourceError::Parse {
            path: path.to_owned(),
            line: at,
            column: Some(value.referenced.column()).filter(|_| at.is_some()),
            message: format!("{field}: {e}"),
        };
        match field {
            Deferred::Metadata => {
                api.metadata = serde_json::from_value(value.value.clone()).map_err(err)?
            }
            Deferred::Spec => {
                api.spec = serde_json::from_value(value.value.clone()).map_err(err)?
            }
            Deferred::Status => {
                api.status = serde_json::from_value(value.value.clone()).map_err(err)?
            }
        }
    }
    validate(&api).map_err(|source| SourceError::Invalid {
        path: path.to_owned(),
        line,
        source,
    })?;
    Ok(api)
}

fn saphyr_error(path: &Path, e: &serde_saphyr::Error) -> SourceError {
    let location = e.location().filter(|l| l.line() > 0);
    let mut message = e.to_string();
    if let Some(l) = &location {
        // The location goes in front, compiler style; drop the parser's own suffix.
        let suffix = format!(" at line {}, column {}", l.line(), l.column());
        if let Some(stripped) = message.strip_suffix(&suffix) {
            message = stripped.to_owned();
        }
    }
    SourceError::Parse {
        path: path.to_owned(),
        line: location.as_ref().map(|l| l.line()),
        column: location.as_ref().map(|l| l.column()),
        message,
    }
}

/// A top-level field of an APIService that appeared before `kind` and so could not be decoded
/// with its type on the spot.
#[derive(Clone, Copy, Debug)]
enum Deferred {
    Metadata,
    Spec,
    Status,
}

impl fmt::Display for Deferred {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Metadata => "metadata",
            Self::Spec => "spec",
            Self::Status => "status",
        })
    }
}

/// One document (or List item), decoded just enough to know what it is.
///
/// Decoding is typed as early as possible so serde-saphyr's errors point at the offending line:
/// once `kind` is known, an APIService's `metadata`, `spec` and `status` are decoded straight into
/// their k8s-openapi types, and other kinds' fields are skipped unread. Only fields that come
/// before `kind` are buffered (as JSON values) and decoded at the end.
#[derive(Debug)]
enum Doc {
    ApiService(Box<ApiServiceDoc>),
    List(Vec<Spanned<Doc>>),
    Other { kind: Option<String> },
}

#[derive(Debug)]
struct ApiServiceDoc {
    api_version: Option<String>,
    metadata: Option<ObjectMeta>,
    spec: Option<APIServiceSpec>,
    status: Option<APIServiceStatus>,
    deferred: Vec<(Deferred, Spanned<serde_json::Value>)>,
}

fn is_list_kind(kind: &str) -> bool {
    kind == "List" || kind == "APIServiceList"
}

// === impl Doc ===

impl<'de> Deserialize<'de> for Doc {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Not a mapping (a bare scalar or sequence as a document): not an object of any kind.
        let Lenient(doc) = Lenient::<Doc>::deserialize(deserializer)?;
        Ok(doc.unwrap_or(Doc::Other { kind: None }))
    }
}

impl<'de> Shape<'de> for Doc {
    const EXPECTING: &'static str = "a Kubernetes object";

    fn read_map<A: MapAccess<'de>>(mut map: A) -> Result<Option<Self>, A::Error> {
        let mut kind: Option<String> = None;
        let mut api_version: Option<String> = None;
        let mut metadata = None;
        let mut spec = None;
        let mut status = None;
        let mut items: Option<Vec<Spanned<Doc>>> = None;
        let mut deferred = Vec::new();

        // A non-string key (legal YAML, never in a Kubernetes object) is `None`: its value is
        // skipped like any unknown field's.
        while let Some(Lenient(key)) = map.next_key::<Lenient<String>>()? {
            let field = match key.as_deref() {
                Some("kind") => {
                    kind = Some(map.next_value()?);
                    continue;
                }
                Some("apiVersion") => {
                    api_version = Some(map.next_value()?);
                    continue;
                }
                // Read before `kind` is known (kubectl prints `apiVersion, items, kind`), so
                // `items` that are not a sequence are skipped, not an error.
                Some("items") if kind.as_deref().is_none_or(is_list_kind) => {
                    items = map.next_value::<Lenient<Vec<Spanned<Doc>>>>()?.0;
                    continue;
                }
                Some("metadata") => Deferred::Metadata,
                Some("spec") => Deferred::Spec,
                Some("status") => Deferred::Status,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            match kind.as_deref() {
                Some("APIService") => match field {
                    Deferred::Metadata => metadata = Some(map.next_value()?),
                    Deferred::Spec => spec = Some(map.next_value()?),
                    Deferred::Status => status = Some(map.next_value()?),
                },
                Some(_) => {
                    map.next_value::<IgnoredAny>()?;
                }
                None => deferred.push((field, map.next_value()?)),
            }
        }

        Ok(Some(match kind.as_deref() {
            Some("APIService") => Doc::ApiService(Box::new(ApiServiceDoc {
                api_version,
                metadata,
                spec,
                status,
                deferred,
            })),
            Some(k) if is_list_kind(k) => Doc::List(items.unwrap_or_default()),
            _ => Doc::Other { kind },
        }))
    }
}

// === impl Lenient ===

/// A value read as `T` when it has the one shape `T` is read from, and `None` (consumed unread)
/// when it has any other. Where a Kubernetes object is *recognised* (is this document an object,
/// is this key a string, are these `items` a list) a surprise is not an error: kubectl skips what
/// it does not recognise, and failing here would refuse a whole file for one odd document. Typed
/// fields (an APIService's `spec`) are decoded strictly, so their errors still name the line.
struct Lenient<T>(Option<T>);

/// What [`Lenient`] reads a `T` from. Each method defaults to "not this shape": the value is
/// skipped and the result is `None`.
trait Shape<'de>: Sized {
    /// What `T` is, for serde's messages.
    const EXPECTING: &'static str;

    fn read_map<A: MapAccess<'de>>(mut map: A) -> Result<Option<Self>, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    fn read_seq<A: SeqAccess<'de>>(mut seq: A) -> Result<Option<Self>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    fn read_str(_: &str) -> Option<Self> {
        None
    }
}

/// A mapping key.
impl Shape<'_> for String {
    const EXPECTING: &'static str = "a mapping key";

    fn read_str(v: &str) -> Option<Self> {
        Some(v.to_owned())
    }
}

/// A List's `items`: a sequence of objects.
impl<'de> Shape<'de> for Vec<Spanned<Doc>> {
    const EXPECTING: &'static str = "a list of objects";

    fn read_seq<A: SeqAccess<'de>>(mut seq: A) -> Result<Option<Self>, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Spanned<Doc>>()? {
            items.push(item);
        }
        Ok(Some(items))
    }
}

impl<'de, T: Shape<'de>> Deserialize<'de> for Lenient<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(LenientVisitor(PhantomData))
    }
}

/// The one visitor behind every [`Lenient`] read: every shape a YAML or JSON value can have goes
/// to `T`'s reader for it, or is skipped.
struct LenientVisitor<T>(PhantomData<T>);

impl<'de, T: Shape<'de>> Visitor<'de> for LenientVisitor<T> {
    type Value = Lenient<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(T::EXPECTING)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        T::read_map(map).map(Lenient)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        T::read_seq(seq).map(Lenient)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Lenient(T::read_str(v)))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Lenient(None))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Lenient(None))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Lenient(None))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Lenient(None))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Lenient(None))
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Lenient(None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::file::tests::api_service;

    const A: &str = "\
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: v1alpha1.wardle.example.com
spec:
  group: wardle.example.com
  version: v1alpha1
  groupPriorityMinimum: 1000
  versionPriority: 15
  service:
    namespace: wardle
    name: api
  caBundle: UEVN
";

    #[test]
    fn multi_document_list_and_other_kinds() {
        let text = format!(
            "# leading comment\n---\n{A}---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n\
             data:\n  items: nope\n---\n---\napiVersion: v1\nkind: List\nitems:\n- {}\n- apiVersion: v1\n  kind: Secret\n",
            api_service("v1.b.io").replace('\n', "\n  ").trim_end()
        );
        let found = parse_manifests(Path::new("/m/a.yaml"), &text).unwrap();
        assert_eq!(found.len(), 2);
        let a = found[0].api.as_ref().unwrap();
        let spec = a.spec.as_ref().unwrap();
        assert_eq!(spec.group.as_deref(), Some("wardle.example.com"));
        assert_eq!(spec.service.as_ref().unwrap().port, None);
        assert_eq!(spec.ca_bundle.as_ref().unwrap().0, b"PEM");
        assert_eq!(found[0].line, Some(3));
        assert_eq!(found[1].name.as_deref(), Some("v1.b.io"));
        assert!(found[1].api.is_ok());
        // The List item's line, not the List's.
        assert!(found[1].line.unwrap() > 20, "{:?}", found[1].line);
    }

    /// `kubectl get apiservices -o yaml` prints keys sorted: `items` before `kind`, and each
    /// item's `apiVersion, kind, metadata, spec, status`; `APIServiceList` is accepted too.
    #[test]
    fn kubectl_style_list_with_status() {
        let text = "\
apiVersion: v1
items:
- apiVersion: apiregistration.k8s.io/v1
  kind: APIService
  metadata:
    name: v1.a.io
    resourceVersion: \"12\"
  spec:
    group: a.io
    version: v1
    groupPriorityMinimum: 100
    versionPriority: 10
  status:
    conditions:
    - type: Available
      status: \"True\"
      reason: Local
      lastTransitionTime: \"2024-01-01T00:00:00Z\"
kind: List
metadata:
  resourceVersion: \"\"
";
        let found = parse_manifests(Path::new("/m/l.yaml"), text).unwrap();
        assert_eq!(found.len(), 1);
        assert!(crate::model::is_available(found[0].api.as_ref().unwrap()));

        let typed = text.replace("kind: List", "kind: APIServiceList");
        assert_eq!(
            parse_manifests(Path::new("/m/l.yaml"), &typed)
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn json_and_fields_before_kind() {
        let json = r#"{"metadata": {"name": "v1.j.io"}, "spec": {"group": "j.io", "version": "v1",
            "groupPriorityMinimum": 100, "versionPriority": 10},
            "kind": "APIService", "apiVersion": "apiregistration.k8s.io/v1"}"#;
        let found = parse_manifests(Path::new("/m/j.json"), json).unwrap();
        assert_eq!(
            found[0].api.as_ref().unwrap().metadata.name.as_deref(),
            Some("v1.j.io")
        );

        // A bad field before `kind` still names a line: where the field's value starts. Only
        // that APIService is refused, under its name (read from the undecoded metadata).
        let bad = "spec:\n  group: j.io\n  groupPriorityMinimum: lots\nkind: APIService\n\
                   apiVersion: apiregistration.k8s.io/v1\nmetadata:\n  name: v1.j.io\n";
        let mut found = parse_manifests(Path::new("/m/j.yaml"), bad).unwrap();
        let found = found.remove(0);
        assert_eq!(found.name.as_deref(), Some("v1.j.io"));
        let err = found.api.unwrap_err();
        let SourceError::Parse { line, message, .. } = &err else {
            panic!("{err}")
        };
        assert!(line.is_some_and(|l| l <= 2), "{err}");
        assert!(message.starts_with("spec: "), "{err}");
    }

    #[test]
    fn syntax_and_type_errors_name_file_line_and_problem() {
        let text = format!("{A}---\n{}", api_service("v1.b.io"))
            .replace("versionPriority: 10", "versionPriority: ten");
        let err = parse_manifests(Path::new("/m/b.yaml"), &text).unwrap_err();
        let SourceError::Parse {
            path,
            line,
            column,
            message,
        } = &err
        else {
            panic!("{err}")
        };
        assert_eq!(path, Path::new("/m/b.yaml"));
        assert_eq!(*line, Some(23));
        assert_eq!(*column, Some(20));
        assert!(message.contains("i32"), "{message}");
        assert!(err.to_string().starts_with("/m/b.yaml:23:20: "), "{err}");

        let err = parse_manifests(
            Path::new("/m/c.yaml"),
            "kind: APIService\nspec: [a, b\nx: y\n",
        )
        .unwrap_err();
        assert!(
            matches!(err, SourceError::Parse { line: Some(_), .. }),
            "{err}"
        );
    }

    /// Where an object is only being recognised, a value of an unexpected shape is skipped, as
    /// kubectl skips it: each row is one file, with how many APIServices it yields and no error.
    #[test]
    fn unexpected_shapes_are_skipped_not_errors() {
        let api = api_service("v1.a.io");
        let rows = [
            (
                "a scalar document".to_owned(),
                "just a string\n".to_owned(),
                0,
            ),
            ("a number document".into(), "42\n".into(), 0),
            ("a null document".into(), "~\n".into(), 0),
            ("a sequence document".into(), "- a\n- b\n".into(), 0),
            (
                "non-string keys".into(),
                format!("1: one\ntrue: yes\n~: none\n? [a, b]\n: c\n? {{a: b}}\n: d\n{api}"),
                1,
            ),
            (
                "List items that are a mapping".into(),
                "apiVersion: v1\nitems: {a: b}\nkind: List\n".into(),
                0,
            ),
            (
                "List items that are a scalar".into(),
                "apiVersion: v1\nitems: 3\nkind: List\n".into(),
                0,
            ),
            (
                "a List item that is a scalar".into(),
                format!(
                    "apiVersion: v1\nkind: List\nitems:\n- 3\n- {}",
                    api.replace('\n', "\n  ")
                ),
                1,
            ),
            (
                "a scalar beside an APIService".into(),
                format!("{api}---\nplain\n"),
                1,
            ),
        ];
        for (what, text, count) in rows {
            let found = parse_manifests(Path::new("/m/x.yaml"), &text)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(found.len(), count, "{what}");
            assert!(found.iter().all(|f| f.api.is_ok()), "{what}: {found:?}");
        }
    }

    fn refused(text: &str) -> (Option<String>, SourceError) {
        let mut found = parse_manifests(Path::new("/m/b.yaml"), text).unwrap();
        assert_eq!(found.len(), 1);
        let found = found.remove(0);
        (found.name, found.api.unwrap_err())
    }

    #[test]
    fn invalid_api_service_and_wrong_api_version_are_refused_by_name() {
        let (name, err) = refused(
            &api_service("v1.b.io").replace("groupPriorityMinimum: 100", "groupPriorityMinimum: 0"),
        );
        assert_eq!(name.as_deref(), Some("v1.b.io"));
        assert!(
            matches!(err, SourceError::Invalid { line: Some(1), .. }),
            "{err}"
        );
        assert!(
            err.to_string().contains(
                "spec.groupPriorityMinimum: Invalid value: 0: must be positive and less than 20000"
            ),
            "{err}"
        );

        let (name, err) =
            refused(&api_service("v1.b.io").replace("apiregistration.k8s.io/v1", "v1"));
        assert_eq!(name.as_deref(), Some("v1.b.io"));
        assert!(err.to_string().contains(r#"apiVersion "v1""#), "{err}");

        // One refused APIService does not take its neighbours in the same file down.
        let text = format!(
            "{}---\n{}",
            api_service("v1.a.io").replace("version: v1", "version: V1"),
            api_service("v1.b.io")
        );
        let found = parse_manifests(Path::new("/m/b.yaml"), &text).unwrap();
        assert!(found[0].api.is_err());
        assert!(found[1].api.is_ok());
    }
}
