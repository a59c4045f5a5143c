//! values.yaml documents its keys: every key at the top level and one level down has a `# --`
//! doc comment (the helm-docs convention) directly above it.

use e2e::helm::chart_dir;

/// Keys at the top level and one level down (`core:`, `core.sidecar:`, `probes.liveness:`) whose
/// comment block directly above has no `# --` doc line, as `line N: key`.
fn undocumented_values_keys(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut missing = Vec::new();
    let mut parent = "";
    for (i, line) in lines.iter().enumerate() {
        let indent = line.len() - line.trim_start().len();
        let rest = line.trim_start();
        if indent > 2 || rest.starts_with('#') || rest.starts_with('-') {
            continue;
        }
        let Some((key, _)) = rest.split_once(':') else {
            continue;
        };
        if key.is_empty()
            || !key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        {
            continue;
        }
        let path = if indent == 0 {
            parent = key;
            key.to_owned()
        } else {
            format!("{parent}.{key}")
        };
        let documented = lines[..i]
            .iter()
            .rev()
            .take_while(|l| l.trim_start().starts_with('#'))
            .any(|l| l.trim_start().starts_with("# -- "));
        if !documented {
            missing.push(format!("line {}: {path}", i + 1));
        }
    }
    missing
}

#[test]
fn every_top_and_second_level_values_key_has_a_doc_comment() {
    let text = std::fs::read_to_string(chart_dir().join("values.yaml")).unwrap();
    let missing = undocumented_values_keys(&text);
    assert!(
        missing.is_empty(),
        "values.yaml keys without a `# -- ` doc comment directly above:\n  {}",
        missing.join("\n  ")
    );

    // The check sees through a plain comment, a blank line and nesting, and skips commented-out
    // examples and list items.
    let sample = "\
# -- Documented.
replicaCount: 2

# A section comment, but not a doc comment.
probes:
  # -- Documented.
  liveness:
    periodSeconds: 10
  readiness:
    periodSeconds: 5
# -- Documented.

items:
  # - group: x
  - name: y
";
    assert_eq!(
        undocumented_values_keys(sample),
        [
            "line 5: probes",
            "line 9: probes.readiness",
            "line 13: items"
        ]
    );
}
