//! The one substitution grammar: which `${…}` in a manifest is a Windvane variable, and which is someone
//! else's text.
//!
//! Where the data comes from: every string value of every manifest (keys are never read). Where it goes:
//! [`crate::decide::render`] fills the variables in for a cluster (the agent, `windvane render`) and checks at build
//! time that they can be filled in (`windvane build`, `publish`); `windvane build` names the apps that have any.
//!
//! The rule, exactly. A `${…}` is a variable when what is between the braces, spaces around it ignored, is
//!
//! - `cluster.name`;
//! - `cluster.labels.KEY`, KEY being one or more letters, digits, `.`, `_`, `-` and `/` (a label key:
//!   `${cluster.labels.topology.kubernetes.io/region}`);
//! - `values.NAME`, `values.NAME.NAME`…, each NAME one or more letters, digits, `_` and `-`.
//!
//! Anything else that starts with `cluster.` or `values.` is a near miss (`${cluster.nmae}`,
//! `${values..x}`), refused with a suggestion rather than left as text, since it was meant as ours. Everything
//! else is text, kept exactly as written: `${cluster}`, `${namespace}`, `${datasource}` and
//! `${__data.fields.X}` of Grafana dashboards, `${1}` of regex replacements, `${HOME}` and `${X:-y}` of shell
//! scripts, a `${` that is never closed. `$${` is a literal `${` (for the rare text that must read like a
//! variable).

use crate::{Error, Result};

/// A well-formed variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variable<'t> {
    /// `${cluster.name}`.
    ClusterName,
    /// `${cluster.labels.KEY}`: the key.
    ClusterLabel(&'t str),
    /// `${values.a.b}`: the path after `values.`, its names separated by dots.
    Values(&'t str),
}

impl std::fmt::Display for Variable<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Variable::ClusterName => f.write_str("cluster.name"),
            Variable::ClusterLabel(key) => write!(f, "cluster.labels.{key}"),
            Variable::Values(path) => write!(f, "values.{path}"),
        }
    }
}

/// One piece of a string: literal text, or a variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece<'t> {
    Text(String),
    Variable(Variable<'t>),
}

/// What a string holds: `Ok` pieces, or the error for a near miss or an unterminated variable.
pub fn split(text: &str) -> Result<Vec<Piece<'_>>> {
    let mut pieces = Vec::new();
    let mut literal = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        let after = &rest[at..];
        if let Some(escaped) = after.strip_prefix("$${") {
            literal.push_str(&rest[..at]);
            literal.push_str("${");
            rest = escaped;
        } else if let Some(inner) = after.strip_prefix("${") {
            literal.push_str(&rest[..at]);
            let Some(end) = inner.find('}') else {
                if is_ours(inner.trim_start()) {
                    return Err(Error::UnterminatedVariable {
                        text: text.to_owned(),
                    });
                }
                literal.push_str(after);
                rest = "";
                continue;
            };
            let expression = inner[..end].trim();
            match parse(expression)? {
                Some(variable) => {
                    if !literal.is_empty() {
                        pieces.push(Piece::Text(std::mem::take(&mut literal)));
                    }
                    pieces.push(Piece::Variable(variable));
                }
                // Another tool's syntax, kept verbatim.
                None => literal.push_str(&after[..end + 3]),
            }
            rest = &inner[end + 1..];
        } else {
            literal.push_str(&rest[..=at]);
            rest = &after[1..];
        }
    }
    literal.push_str(rest);
    if !literal.is_empty() {
        pieces.push(Piece::Text(literal));
    }
    Ok(pieces)
}

/// Whether `text` holds a variable, or a near miss (which is an error wherever it is rendered).
pub fn has_variable(text: &str) -> bool {
    text.contains("${")
        && split(text).map_or(true, |pieces| {
            pieces
                .iter()
                .any(|piece| matches!(piece, Piece::Variable(_)))
        })
}

/// Whether an expression (trimmed) is meant as ours: it starts with one of our namespaces and a dot.
fn is_ours(expression: &str) -> bool {
    expression.starts_with("cluster.") || expression.starts_with("values.")
}

/// A trimmed `${…}` expression: `Ok(Some)` for a variable, `Ok(None)` for someone else's text, `Err` for a near
/// miss, with a suggestion.
pub fn parse(expression: &str) -> Result<Option<Variable<'_>>> {
    if expression == "cluster.name" {
        return Ok(Some(Variable::ClusterName));
    }
    if let Some(key) = expression.strip_prefix("cluster.labels.") {
        if key.is_empty() {
            return Err(Error::NoLabelKey {
                expression: expression.to_owned(),
            });
        }
        if let Some(bad) = key.chars().find(|c| !is_label_char(*c)) {
            return Err(Error::BadLabelKeyChar {
                expression: expression.to_owned(),
                found: bad,
            });
        }
        return Ok(Some(Variable::ClusterLabel(key)));
    }
    if expression == "cluster.labels" {
        return Err(Error::NoLabelKey {
            expression: expression.to_owned(),
        });
    }
    if let Some(rest) = expression.strip_prefix("cluster.") {
        return Err(cluster_near_miss(expression, rest));
    }
    if let Some(path) = expression.strip_prefix("values.") {
        for name in path.split('.') {
            if name.is_empty() {
                return Err(Error::EmptyValuesName {
                    expression: expression.to_owned(),
                });
            }
            if let Some(bad) = name.chars().find(|c| !is_name_char(*c)) {
                return Err(Error::BadValuesNameChar {
                    expression: expression.to_owned(),
                    found: bad,
                });
            }
        }
        return Ok(Some(Variable::Values(path)));
    }
    Ok(None)
}

/// The error for `${cluster.REST}` that is neither `cluster.name` nor `cluster.labels.KEY`, with the variable
/// it was probably meant to be.
fn cluster_near_miss(expression: &str, rest: &str) -> Error {
    let (first, tail) = rest.split_once('.').unwrap_or((rest, ""));
    let meant = if tail.is_empty() && closest(first, ["name"]).is_some() {
        Some("cluster.name".to_owned())
    } else if !tail.is_empty() && closest(first, ["labels"]).is_some() {
        Some(format!("cluster.labels.{tail}"))
    } else {
        None
    };
    Error::UnknownVariable {
        expression: expression.to_owned(),
        meant,
    }
}

fn is_label_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/')
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-')
}

/// The candidate closest to `word`, case aside, for "did you mean" hints: at most two edits, and fewer than
/// half its length (so that `c` does not suggest `a`).
pub fn closest<'c>(word: &str, candidates: impl IntoIterator<Item = &'c str>) -> Option<&'c str> {
    let word = word.to_ascii_lowercase();
    candidates
        .into_iter()
        .map(|candidate| {
            (
                edit_distance(&word, &candidate.to_ascii_lowercase()),
                candidate,
            )
        })
        .filter(|(distance, candidate)| {
            *distance <= 2 && *distance * 2 < word.len().max(candidate.len())
        })
        .min()
        .map(|(_, candidate)| candidate)
}

/// Edit distance with adjacent transpositions (optimal string alignment): `nmae` is one edit from `name`.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // Rows i-2, i-1 and i of the table.
    let mut before: Vec<usize> = Vec::new();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for i in 1..=a.len() {
        let mut current = vec![i; b.len() + 1];
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (previous[j - 1] + cost)
                .min(previous[j] + 1)
                .min(current[j - 1] + 1);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(before[j - 2] + 1);
            }
            current[j] = best;
        }
        before = std::mem::replace(&mut previous, current);
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn variables(text: &str) -> Vec<String> {
        split(text)
            .unwrap()
            .into_iter()
            .filter_map(|piece| match piece {
                Piece::Variable(variable) => Some(variable.to_string()),
                Piece::Text(_) => None,
            })
            .collect()
    }

    #[test]
    fn only_well_formed_variables_are_ours() {
        assert_eq!(
            variables(
                "${cluster.name}-${ cluster.labels.topology.kubernetes.io/region }:${values.a.b-c_d}"
            ),
            [
                "cluster.name",
                "cluster.labels.topology.kubernetes.io/region",
                "values.a.b-c_d"
            ]
        );
        // Grafana, Prometheus, shell: text, whatever the app's values.
        for text in [
            "${cluster}",
            "${ cluster }",
            "${values}",
            "${namespace}",
            "${__data.fields.Pod}",
            "${__field.labels.cluster}",
            "${datasource}",
            "${cluster:raw}",
            "${1}",
            "${HOME}",
            "${HOSTNAME:-x}",
            "${clusters.x}",
            "${valuesx}",
            "${env.HOME}",
            "${}",
            "tail ${",
            "${cluster",
        ] {
            assert_eq!(
                split(text).unwrap(),
                vec![Piece::Text(text.to_owned())],
                "{text}"
            );
            assert!(!has_variable(text), "{text}");
        }
        assert_eq!(
            split("$${values.x}").unwrap(),
            vec![Piece::Text("${values.x}".to_owned())]
        );
        assert!(has_variable("a ${values.x} b"));
    }

    #[test]
    fn near_misses_are_errors_with_a_suggestion() {
        let error = split("${cluster.nmae}").unwrap_err().to_string();
        assert!(error.contains("did you mean ${cluster.name}?"), "{error}");
        let error = split("x ${cluster.lables.env}").unwrap_err().to_string();
        assert!(
            error.contains("did you mean ${cluster.labels.env}?"),
            "{error}"
        );
        let error = split("${cluster.region}").unwrap_err().to_string();
        assert!(
            error.contains("unknown variable ${cluster.region}"),
            "{error}"
        );
        assert!(
            split("${cluster.labels.}")
                .unwrap_err()
                .to_string()
                .contains("names no label")
        );
        assert!(
            split("${cluster.labels}")
                .unwrap_err()
                .to_string()
                .contains("names no label")
        );
        assert!(
            split("${values..a}")
                .unwrap_err()
                .to_string()
                .contains("empty name")
        );
        assert!(
            split("${values.a b}")
                .unwrap_err()
                .to_string()
                .contains("letters, digits")
        );
        assert!(
            split("${values.x")
                .unwrap_err()
                .to_string()
                .contains("unterminated")
        );
        assert!(has_variable("${cluster.nmae}"));
    }

    #[test]
    fn closest_candidates() {
        assert_eq!(closest("replcas", ["replicas", "image"]), Some("replicas"));
        assert_eq!(closest("Name", ["name"]), Some("name"));
        assert_eq!(closest("region", ["name"]), None);
        assert_eq!(closest("c", ["a", "b"]), None);
        assert_eq!(closest("nmae", ["name"]), Some("name"));
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("nmae", "name"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
    }
}
