//! JSON values written as block-style YAML, for people to read: `windvane render` output and the agent's
//! diffs. Strings are written plain only when every YAML reader (1.1 or 1.2) reads them back as the same
//! string; otherwise they are double-quoted (JSON escaping is valid YAML) or, when multi-line, a literal block.

use serde_json::Value;

/// Writes one value as a YAML document body (no `---`), ending with a newline.
pub fn to_yaml_string(value: &Value) -> String {
    let mut out = String::new();
    match value {
        Value::Object(map) if !map.is_empty() => write_map(&mut out, map, 0),
        Value::Array(items) if !items.is_empty() => write_seq(&mut out, items, 0),
        scalar => {
            out.push_str(&inline(scalar, 0));
            out.push('\n');
        }
    }
    out
}

/// YAML readers refuse an implicit (`key: value`) key longer than 1024 characters; longer keys are written
/// as explicit ones (`? key`, then `: value` on the next line).
const MAX_IMPLICIT_KEY_CHARS: usize = 1024;

fn write_map(out: &mut String, map: &serde_json::Map<String, Value>, indent: usize) {
    for (key, value) in map {
        let key = scalar_string(key, indent, true);
        out.push_str(&" ".repeat(indent));
        if key.chars().count() >= MAX_IMPLICIT_KEY_CHARS {
            out.push_str("? ");
            out.push_str(&key);
            out.push('\n');
            out.push_str(&" ".repeat(indent));
        } else {
            out.push_str(&key);
        }
        out.push(':');
        write_child(out, value, indent, false);
    }
}

fn write_seq(out: &mut String, items: &[Value], indent: usize) {
    for item in items {
        out.push_str(&" ".repeat(indent));
        out.push('-');
        write_child(out, item, indent, true);
    }
}

/// Writes the value after `key:` or `-`, nesting collections on the following lines.
fn write_child(out: &mut String, value: &Value, indent: usize, in_seq: bool) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            if in_seq {
                // `- key: value` keeps list items of objects compact, as kubectl writes them.
                let mut nested = String::new();
                write_map(&mut nested, map, indent + 2);
                out.push(' ');
                out.push_str(nested.trim_start());
            } else {
                out.push('\n');
                write_map(out, map, indent + 2);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            out.push('\n');
            // Kubernetes style: sequences under a key are not indented further.
            write_seq(out, items, if in_seq { indent + 2 } else { indent });
        }
        scalar => {
            out.push(' ');
            out.push_str(&inline(scalar, indent + 2));
            out.push('\n');
        }
    }
}

fn inline(value: &Value, indent: usize) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => scalar_string(s, indent, false),
        Value::Array(_) => "[]".to_owned(),
        Value::Object(_) => "{}".to_owned(),
    }
}

fn scalar_string(s: &str, indent: usize, is_key: bool) -> String {
    if is_plain_safe(s) {
        return s.to_owned();
    }
    if !is_key && let Some(block) = literal_block(s, indent) {
        return block;
    }
    serde_json::to_string(s).expect("a string always serializes")
}

/// A literal block (`|` or `|-`) for multi-line text that it can carry exactly.
fn literal_block(s: &str, indent: usize) -> Option<String> {
    if !s.contains('\n') || s.starts_with([' ', '\t', '\n']) || s.ends_with("\n\n") {
        return None;
    }
    if s.chars().any(|c| c.is_control() && c != '\n') || s.lines().any(|l| l.ends_with([' ', '\t']))
    {
        return None;
    }
    // At column 0 (a top-level string), a line starting with `---` or `...` would be a document marker.
    if indent == 0
        && s.lines()
            .any(|l| l.starts_with("---") || l.starts_with("..."))
    {
        return None;
    }
    let (indicator, body) = match s.strip_suffix('\n') {
        Some(body) => ("|", body),
        None => ("|-", s),
    };
    let pad = " ".repeat(indent);
    let mut out = indicator.to_owned();
    for line in body.split('\n') {
        out.push('\n');
        if !line.is_empty() {
            out.push_str(&pad);
            out.push_str(line);
        }
    }
    Some(out)
}

/// True when `s` can be written unquoted and reads back as the same string in YAML 1.1 and 1.2.
fn is_plain_safe(s: &str) -> bool {
    let Some(first) = s.chars().next() else {
        return false;
    };
    if !(first.is_ascii_alphabetic()
        || first == '/'
        || (first == '.' && s.len() > 1 && !s[1..].starts_with(|c: char| c.is_ascii_digit())))
    {
        return false;
    }
    // `...` at the start of a line ends the document (a top-level string or key is written at column 0).
    if s.ends_with([':', ' ']) || s.contains(": ") || s.contains(" #") || s.starts_with("...") {
        return false;
    }
    if !s
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || " _./-:@=+,()".contains(c))
    {
        return false;
    }
    let lower = s.to_ascii_lowercase();
    let special = [
        "true", "false", "yes", "no", "on", "off", "y", "n", "null", "~", ".inf", ".nan",
    ];
    !special.contains(&lower.as_str())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn writes_kubernetes_style_block_yaml() {
        let object = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "demo", "labels": {"app.kubernetes.io/name": "demo"}},
            "data": {"mode": "0644", "flag": "on", "empty": "", "script": "echo hi\nexit 0\n", "port": "8080"},
            "list": [{"name": "a", "value": 1}, "x", [], {}],
        });
        let yaml = to_yaml_string(&object);
        assert_eq!(
            yaml,
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: demo\n  labels:\n    app.kubernetes.io/name: demo\n\
             data:\n  mode: \"0644\"\n  flag: \"on\"\n  empty: \"\"\n  script: |\n    echo hi\n    exit 0\n  port: \"8080\"\n\
             list:\n- name: a\n  value: 1\n- x\n- []\n- {}\n"
        );
    }

    #[test]
    fn quotes_what_a_reader_would_misread() {
        for s in [
            "true", "No", "~", "1e3", "-1", ".5", "a: b", "x #y", "", " lead", "key:", "@at",
            "*star",
        ] {
            assert!(!is_plain_safe(s), "{s:?} must be quoted");
        }
        for s in [
            "prod",
            "nginx:1.27",
            "/healthz",
            "a b",
            "app.kubernetes.io/name",
            ".config",
        ] {
            assert!(is_plain_safe(s), "{s:?} can be plain");
        }
    }
}
