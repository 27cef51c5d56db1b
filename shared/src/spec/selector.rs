//! Kubernetes label selectors, with Kubernetes semantics: which apps a cluster gets, and which clusters the
//! fleet page shows.
//!
//! Where selectors come from: `fleet.yaml` (an app's `selector` and its customizations', in the structured
//! `matchLabels` / `matchExpressions` form, read by `windvane_publisher::source`), and the command line (`windvane status
//! --selector 'env=prod,region in (eu,us)'`, the kubectl string form, read by [`LabelSelector::parse`]). Where
//! they go: into the bundle, then to [`LabelSelector::matches`] against a cluster's labels (set by its operator
//! with `--label k=v`, read by [`parse_label_assignment`]). [`std::fmt::Display`] writes the string form back,
//! for the fleet page.
//!
//! Semantics are those of `metav1.LabelSelector`: every requirement must hold; an empty selector matches every
//! cluster; `NotIn` and `DoesNotExist` match a cluster that lacks the key.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// A cluster's labels.
pub type Labels = BTreeMap<String, String>;

/// A label selector: `matchLabels` and `matchExpressions`, all of which must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelector {
    /// Each key must be present with exactly this value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    /// Each requirement must hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<Requirement>,
}

/// One `matchExpressions` entry: `key operator values`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Requirement {
    /// The label key.
    pub key: String,
    /// How the label's value is compared with `values`.
    pub operator: Operator,
    /// One or more values for `In`/`NotIn`; none for `Exists`/`DoesNotExist`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// A `matchExpressions` operator, written exactly as Kubernetes writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Operator {
    /// The key is present and its value is one of the values.
    In,
    /// The key is absent, or its value is none of the values.
    NotIn,
    /// The key is present, with any value.
    Exists,
    /// The key is absent.
    DoesNotExist,
}

impl Requirement {
    /// True when `labels` satisfy this requirement. A requirement that [`LabelSelector::validate`] would refuse
    /// is read as plain set logic: `In` with no values matches nothing, `NotIn` with none matches everything.
    pub fn matches(&self, labels: &Labels) -> bool {
        let value = labels.get(&self.key);
        match self.operator {
            Operator::In => value.is_some_and(|v| self.values.contains(v)),
            Operator::NotIn => value.is_none_or(|v| !self.values.contains(v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
        }
    }
}

impl LabelSelector {
    /// True when the selector is empty and so matches every cluster.
    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.match_expressions.is_empty()
    }

    /// True when every `matchLabels` entry and every requirement holds for `labels`. An empty selector
    /// matches everything.
    pub fn matches(&self, labels: &Labels) -> bool {
        self.match_labels
            .iter()
            .all(|(key, value)| labels.get(key) == Some(value))
            && self
                .match_expressions
                .iter()
                .all(|requirement| requirement.matches(labels))
    }

    /// Checks keys, values and operators as the Kubernetes API server would. `context` says where the selector
    /// is (`app monitoring`), for the message.
    pub fn validate(&self, context: &str) -> Result<()> {
        let invalid = |detail: String| Error::InvalidSelector {
            context: context.to_owned(),
            detail,
        };
        for (key, value) in &self.match_labels {
            check_label_key(key).map_err(|d| invalid(format!("matchLabels key {key:?}: {d}")))?;
            check_label_value(value)
                .map_err(|d| invalid(format!("matchLabels {key}: value {value:?}: {d}")))?;
        }
        for (index, requirement) in self.match_expressions.iter().enumerate() {
            let at = format!("matchExpressions[{index}]");
            let key = &requirement.key;
            check_label_key(key).map_err(|d| invalid(format!("{at}: key {key:?}: {d}")))?;
            match requirement.operator {
                Operator::In | Operator::NotIn if requirement.values.is_empty() => {
                    return Err(invalid(format!(
                        "{at} ({key} {:?}): needs at least one value",
                        requirement.operator
                    )));
                }
                Operator::Exists | Operator::DoesNotExist if !requirement.values.is_empty() => {
                    return Err(invalid(format!(
                        "{at} ({key} {:?}): takes no values",
                        requirement.operator
                    )));
                }
                _ => {}
            }
            for value in &requirement.values {
                check_label_value(value)
                    .map_err(|d| invalid(format!("{at}: value {value:?}: {d}")))?;
            }
        }
        Ok(())
    }

    /// Parses kubectl's string form: comma-separated requirements, all of which must hold:
    /// `env=prod` (or `env==prod`), `tier!=db`, `region in (eu,us)`, `team notin (x)`, `gpu` (exists),
    /// `!legacy` (does not exist). Equalities become `matchLabels` (a second, different equality on the same
    /// key becomes an `In` requirement, so that the selector still means what was written); `!=` and `notin`
    /// both become `NotIn` requirements. An empty or blank string is the empty selector. The result is
    /// validated; errors say which part is wrong.
    pub fn parse(text: &str) -> Result<Self> {
        let mut selector = LabelSelector::default();
        let mut parser = SelectorParser {
            text,
            tokens: tokenize(text),
            next: 0,
        };
        if parser.tokens.is_empty() {
            return Ok(selector);
        }
        loop {
            parser.requirement(&mut selector)?;
            match parser.take() {
                None => break,
                Some(Token {
                    kind: TokenKind::Comma,
                    ..
                }) => {
                    if parser.peek().is_none() {
                        return Err(
                            parser.error_at_end("a trailing comma; remove it or add a requirement")
                        );
                    }
                }
                Some(token) => {
                    return Err(parser.error(&token, "expected ',' between requirements"));
                }
            }
        }
        selector.validate(&format!("{text:?}"))?;
        Ok(selector)
    }
}

impl fmt::Display for LabelSelector {
    /// The kubectl string form, which [`LabelSelector::parse`] reads back to an equal selector. The empty
    /// selector (which matches everything) is the empty string.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut separator = |f: &mut fmt::Formatter<'_>| {
            let result = if first { Ok(()) } else { f.write_str(",") };
            first = false;
            result
        };
        for (key, value) in &self.match_labels {
            separator(f)?;
            write!(f, "{key}={value}")?;
        }
        for requirement in &self.match_expressions {
            separator(f)?;
            let key = &requirement.key;
            let values = requirement.values.join(",");
            match requirement.operator {
                // `k in ()` would be an empty value list, which the parser refuses. Parsed text gives this
                // requirement only for a second, conflicting `k=`, which is how it reads back; a structured
                // selector's `In [""]` means what `k=` means.
                Operator::In if requirement.values == [""] => write!(f, "{key}=")?,
                Operator::In => write!(f, "{key} in ({values})")?,
                Operator::NotIn if requirement.values.len() == 1 => write!(f, "{key}!={values}")?,
                Operator::NotIn => write!(f, "{key} notin ({values})")?,
                Operator::Exists => write!(f, "{key}")?,
                Operator::DoesNotExist => write!(f, "!{key}")?,
            }
        }
        Ok(())
    }
}

/// Parses the command line's `--label k=v` into a validated key and value. The value may be empty (`k=`), as
/// Kubernetes allows.
pub fn parse_label_assignment(text: &str) -> Result<(String, String)> {
    let invalid = |detail: String| Error::InvalidSelector {
        context: format!("label {text:?}"),
        detail,
    };
    let Some((key, value)) = text.split_once('=') else {
        return Err(invalid("expected key=value, such as env=prod".to_owned()));
    };
    let (key, value) = (key.trim(), value.trim());
    check_label_key(key).map_err(|d| invalid(format!("key {key:?}: {d}")))?;
    check_label_value(value).map_err(|d| invalid(format!("value {value:?}: {d}")))?;
    Ok((key.to_owned(), value.to_owned()))
}

/// Why a label key, label value or key prefix is not what the API server takes; put in a selector's error
/// after what it is about (`key "a/-b": …`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelProblem {
    /// A name or value longer than 63 characters (its length).
    TooLong(usize),
    /// A character other than letters, digits, `-`, `_` and `.`.
    BadChar(char),
    /// A name or value that does not start and end with a letter or digit.
    Edges,
    /// A key whose name part (after the `/`) is empty.
    EmptyName,
    /// An empty prefix (`/name`).
    EmptyPrefix,
    /// A prefix longer than 253 characters (its length).
    PrefixTooLong(usize),
    /// A prefix that is not a DNS subdomain.
    PrefixNotDns,
    /// A key whose prefix has a problem.
    Prefix(String, Box<LabelProblem>),
}

impl fmt::Display for LabelProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LabelProblem::TooLong(length) => write!(f, "{length} characters, more than 63"),
            LabelProblem::BadChar(bad) => {
                write!(
                    f,
                    "{bad:?} is not allowed: use letters, digits, '-', '_' and '.'"
                )
            }
            LabelProblem::Edges => f.write_str("must start and end with a letter or digit"),
            LabelProblem::EmptyName => f.write_str("the name part is empty"),
            LabelProblem::EmptyPrefix => f.write_str("empty"),
            LabelProblem::PrefixTooLong(length) => write!(f, "{length} characters, more than 253"),
            LabelProblem::PrefixNotDns => {
                f.write_str("must be a DNS subdomain: lower-case letters, digits, '-' and '.'")
            }
            LabelProblem::Prefix(prefix, problem) => write!(f, "prefix {prefix:?}: {problem}"),
        }
    }
}

/// A label key: an optional DNS-subdomain prefix (at most 253 characters) and `/`, then a name of at most 63
/// characters of `[A-Za-z0-9-_.]` that starts and ends with a letter or digit.
fn check_label_key(key: &str) -> std::result::Result<(), LabelProblem> {
    let name = match key.split_once('/') {
        Some((prefix, name)) => {
            check_dns_subdomain(prefix)
                .map_err(|problem| LabelProblem::Prefix(prefix.to_owned(), Box::new(problem)))?;
            name
        }
        None => key,
    };
    if name.is_empty() {
        return Err(LabelProblem::EmptyName);
    }
    check_label_name(name)
}

/// A label value: empty, or at most 63 characters of `[A-Za-z0-9-_.]` that start and end with a letter or
/// digit.
fn check_label_value(value: &str) -> std::result::Result<(), LabelProblem> {
    if value.is_empty() {
        Ok(())
    } else {
        check_label_name(value)
    }
}

fn check_label_name(name: &str) -> std::result::Result<(), LabelProblem> {
    if name.len() > 63 {
        return Err(LabelProblem::TooLong(name.len()));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(LabelProblem::BadChar(bad));
    }
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric())
        || !name.ends_with(|c: char| c.is_ascii_alphanumeric())
    {
        return Err(LabelProblem::Edges);
    }
    Ok(())
}

/// RFC 1123 subdomain: at most 253 characters, dot-separated labels of lower-case letters, digits and '-',
/// each starting and ending with a letter or digit.
fn check_dns_subdomain(text: &str) -> std::result::Result<(), LabelProblem> {
    if text.is_empty() {
        return Err(LabelProblem::EmptyPrefix);
    }
    if text.len() > 253 {
        return Err(LabelProblem::PrefixTooLong(text.len()));
    }
    for label in text.split('.') {
        let ok = !label.is_empty()
            && label
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err(LabelProblem::PrefixNotDns);
        }
    }
    Ok(())
}

#[derive(Debug, Clone, PartialEq)]
enum TokenKind {
    Word(String),
    Equals,
    DoubleEquals,
    NotEquals,
    Bang,
    Open,
    Close,
    Comma,
    /// `<` or `>`: Kubernetes' `gt`/`lt`, which a label selector in a `LabelSelector` object cannot express.
    Compare(char),
}

#[derive(Debug, Clone)]
struct Token {
    kind: TokenKind,
    /// Byte offset of the token, for the message.
    at: usize,
}

fn tokenize(text: &str) -> Vec<Token> {
    let mut tokens = Vec::new();
    let mut chars = text.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        let kind = match c {
            c if c.is_whitespace() => continue,
            ',' => TokenKind::Comma,
            '(' => TokenKind::Open,
            ')' => TokenKind::Close,
            '<' | '>' => TokenKind::Compare(c),
            '=' if chars.next_if(|&(_, c)| c == '=').is_some() => TokenKind::DoubleEquals,
            '=' => TokenKind::Equals,
            '!' if chars.next_if(|&(_, c)| c == '=').is_some() => TokenKind::NotEquals,
            '!' => TokenKind::Bang,
            _ => {
                let mut word = String::from(c);
                while let Some((_, c)) = chars.next_if(|&(_, c)| !is_special(c)) {
                    word.push(c);
                }
                TokenKind::Word(word)
            }
        };
        tokens.push(Token { kind, at });
    }
    tokens
}

fn is_special(c: char) -> bool {
    c.is_whitespace() || matches!(c, ',' | '(' | ')' | '=' | '!' | '<' | '>')
}

struct SelectorParser<'t> {
    text: &'t str,
    tokens: Vec<Token>,
    next: usize,
}

impl SelectorParser<'_> {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.next)
    }

    fn take(&mut self) -> Option<Token> {
        let token = self.tokens.get(self.next).cloned();
        self.next += 1;
        token
    }

    fn error(&self, token: &Token, detail: &str) -> Error {
        let rest = self.text.get(token.at..).unwrap_or_default();
        Error::InvalidSelector {
            context: format!("{:?}", self.text),
            detail: format!(
                "at {rest:?} (character {}): {detail}",
                self.text[..token.at].chars().count() + 1
            ),
        }
    }

    fn error_at_end(&self, detail: &str) -> Error {
        Error::InvalidSelector {
            context: format!("{:?}", self.text),
            detail: format!("at the end: {detail}"),
        }
    }

    fn word(&mut self, what: &str) -> Result<(String, Token)> {
        match self.take() {
            Some(token) => match &token.kind {
                TokenKind::Word(word) => Ok((word.clone(), token)),
                _ => Err(self.error(&token, &format!("expected {what}"))),
            },
            None => Err(self.error_at_end(&format!("expected {what}"))),
        }
    }

    /// One requirement, added to `selector`.
    fn requirement(&mut self, selector: &mut LabelSelector) -> Result<()> {
        if matches!(
            self.peek(),
            Some(Token {
                kind: TokenKind::Bang,
                ..
            })
        ) {
            self.next += 1;
            let (key, token) = self.word("a label key after '!'")?;
            self.check_key(&key, &token)?;
            selector.match_expressions.push(Requirement {
                key,
                operator: Operator::DoesNotExist,
                values: vec![],
            });
            return Ok(());
        }
        let (key, key_token) = self.word("a label key")?;
        self.check_key(&key, &key_token)?;
        let Some(operator) = self.peek().cloned() else {
            selector.match_expressions.push(Requirement {
                key,
                operator: Operator::Exists,
                values: vec![],
            });
            return Ok(());
        };
        match &operator.kind {
            TokenKind::Comma => {
                selector.match_expressions.push(Requirement {
                    key,
                    operator: Operator::Exists,
                    values: vec![],
                });
            }
            TokenKind::Equals | TokenKind::DoubleEquals | TokenKind::NotEquals => {
                self.next += 1;
                let value = self.single_value()?;
                if operator.kind == TokenKind::NotEquals {
                    selector.match_expressions.push(Requirement {
                        key,
                        operator: Operator::NotIn,
                        values: vec![value],
                    });
                } else {
                    match selector.match_labels.get(&key) {
                        Some(existing) if *existing == value => {}
                        // `env=a,env=b` must keep matching nothing, as in Kubernetes.
                        Some(_) => selector.match_expressions.push(Requirement {
                            key,
                            operator: Operator::In,
                            values: vec![value],
                        }),
                        None => {
                            selector.match_labels.insert(key, value);
                        }
                    }
                }
            }
            TokenKind::Word(word) if word == "in" || word == "notin" => {
                self.next += 1;
                let operator = if word == "in" {
                    Operator::In
                } else {
                    Operator::NotIn
                };
                let values = self.value_set(&operator_name(operator))?;
                selector.match_expressions.push(Requirement {
                    key,
                    operator,
                    values,
                });
            }
            TokenKind::Compare(c) => {
                return Err(self.error(
                    &operator,
                    &format!("'{c}' (numeric comparison) cannot be expressed in a LabelSelector; use in/notin"),
                ));
            }
            _ => {
                return Err(self.error(
                    &operator,
                    "expected =, ==, !=, in, notin, ',' or the end after a key",
                ));
            }
        }
        Ok(())
    }

    /// The value after `=`, `==` or `!=`: a word, or nothing (the empty value) before a comma or the end.
    fn single_value(&mut self) -> Result<String> {
        match self.peek().cloned() {
            None
            | Some(Token {
                kind: TokenKind::Comma,
                ..
            }) => Ok(String::new()),
            Some(Token {
                kind: TokenKind::Word(word),
                at,
            }) => {
                self.next += 1;
                check_label_value(&word).map_err(|d| {
                    self.error(
                        &Token {
                            kind: TokenKind::Word(word.clone()),
                            at,
                        },
                        &d.to_string(),
                    )
                })?;
                Ok(word)
            }
            Some(token) => Err(self.error(&token, "expected a label value")),
        }
    }

    /// `( v1, v2, ... )`, at least one value.
    fn value_set(&mut self, operator: &str) -> Result<Vec<String>> {
        match self.take() {
            Some(Token {
                kind: TokenKind::Open,
                ..
            }) => {}
            Some(token) => {
                return Err(self.error(&token, &format!("expected '(' after {operator}")));
            }
            None => return Err(self.error_at_end(&format!("expected '(' after {operator}"))),
        }
        let mut values = Vec::new();
        loop {
            let (value, token) = self.word("a value")?;
            check_label_value(&value).map_err(|d| self.error(&token, &d.to_string()))?;
            values.push(value);
            match self.take() {
                Some(Token {
                    kind: TokenKind::Comma,
                    ..
                }) => {}
                Some(Token {
                    kind: TokenKind::Close,
                    ..
                }) => return Ok(values),
                Some(token) => {
                    return Err(self.error(&token, "expected ',' or ')' in the value list"));
                }
                None => return Err(self.error_at_end("the value list is not closed with ')'")),
            }
        }
    }

    fn check_key(&self, key: &str, token: &Token) -> Result<()> {
        check_label_key(key).map_err(|d| self.error(token, &format!("label key: {d}")))
    }
}

fn operator_name(operator: Operator) -> String {
    match operator {
        Operator::NotIn => "notin".to_owned(),
        _ => "in".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn sel(text: &str) -> LabelSelector {
        LabelSelector::parse(text).unwrap()
    }

    fn detail(text: &str) -> String {
        match LabelSelector::parse(text) {
            Err(Error::InvalidSelector { detail, .. }) => detail,
            other => panic!("{text}: expected InvalidSelector, got {other:?}"),
        }
    }

    #[test]
    fn empty_selector_matches_everything() {
        let empty = LabelSelector::default();
        assert!(empty.matches(&Labels::new()));
        assert!(empty.matches(&labels(&[("env", "prod")])));
        assert_eq!(sel(""), empty);
        assert_eq!(sel("   "), empty);
        assert_eq!(empty.to_string(), "");
    }

    #[test]
    fn match_labels_need_every_key_with_its_value() {
        let s = sel("env=prod,tier=web");
        assert!(s.matches(&labels(&[("env", "prod"), ("tier", "web"), ("x", "y")])));
        assert!(!s.matches(&labels(&[("env", "prod")])));
        assert!(!s.matches(&labels(&[("env", "dev"), ("tier", "web")])));
    }

    #[test]
    fn each_operator() {
        let cluster = labels(&[("region", "eu"), ("gpu", "")]);
        let none = Labels::new();
        let req = |key: &str, operator, values: &[&str]| LabelSelector {
            match_labels: BTreeMap::new(),
            match_expressions: vec![Requirement {
                key: key.to_owned(),
                operator,
                values: values.iter().map(|v| (*v).to_owned()).collect(),
            }],
        };
        assert!(req("region", Operator::In, &["eu", "us"]).matches(&cluster));
        assert!(!req("region", Operator::In, &["us"]).matches(&cluster));
        assert!(
            !req("region", Operator::In, &["eu"]).matches(&none),
            "In needs the key"
        );
        assert!(!req("region", Operator::NotIn, &["eu"]).matches(&cluster));
        assert!(req("region", Operator::NotIn, &["us"]).matches(&cluster));
        assert!(
            req("region", Operator::NotIn, &["eu"]).matches(&none),
            "NotIn matches an absent key"
        );
        assert!(
            req("gpu", Operator::Exists, &[]).matches(&cluster),
            "an empty value still exists"
        );
        assert!(!req("gpu", Operator::Exists, &[]).matches(&none));
        assert!(!req("gpu", Operator::DoesNotExist, &[]).matches(&cluster));
        assert!(req("gpu", Operator::DoesNotExist, &[]).matches(&none));
    }

    #[test]
    fn parses_the_kubectl_syntax() {
        let s = sel("env=prod, tier!=db,region in (eu, us),team notin (x),gpu,!legacy,zone==a");
        assert_eq!(s.match_labels, labels(&[("env", "prod"), ("zone", "a")]));
        let ops: Vec<(&str, Operator, usize)> = s
            .match_expressions
            .iter()
            .map(|r| (r.key.as_str(), r.operator, r.values.len()))
            .collect();
        assert_eq!(
            ops,
            vec![
                ("tier", Operator::NotIn, 1),
                ("region", Operator::In, 2),
                ("team", Operator::NotIn, 1),
                ("gpu", Operator::Exists, 0),
                ("legacy", Operator::DoesNotExist, 0),
            ]
        );
        let cluster = labels(&[
            ("env", "prod"),
            ("zone", "a"),
            ("tier", "web"),
            ("region", "us"),
            ("gpu", "1"),
        ]);
        assert!(s.matches(&cluster));
        let mut legacy = cluster.clone();
        legacy.insert("legacy".to_owned(), "true".to_owned());
        assert!(!s.matches(&legacy));
    }

    #[test]
    fn conflicting_equalities_still_match_nothing() {
        let s = sel("env=a,env=b");
        assert!(!s.matches(&labels(&[("env", "a")])));
        assert!(!s.matches(&labels(&[("env", "b")])));
        assert_eq!(sel("env=a,env=a"), sel("env=a"));
    }

    #[test]
    fn display_round_trips() {
        for text in [
            "env=prod,tier!=db,region in (eu,us),team notin (x,y),gpu,!legacy",
            "topology.kubernetes.io/region in (eu-west-1)",
            "env=",
            "example.com/team=a_b.c-d",
            "env=a,env in (b)",
        ] {
            let s = sel(text);
            assert_eq!(s.to_string(), text);
            assert_eq!(sel(&s.to_string()), s);
        }
        // Normalised forms.
        assert_eq!(sel("tier notin (db)").to_string(), "tier!=db");
        assert_eq!(sel(" b = 2 , a == 1 ").to_string(), "a=1,b=2");
    }

    #[test]
    fn parse_errors_say_which_part_is_wrong() {
        assert!(
            detail("region in (eu").contains("not closed"),
            "{}",
            detail("region in (eu")
        );
        assert!(detail("region in eu").contains("expected '(' after in"));
        assert!(detail("region in ()").contains("at \")\""));
        assert!(detail("env=prod,").contains("trailing comma"));
        assert!(detail("env=prod tier=db").contains("at \"tier=db\""));
        assert!(detail("=prod").contains("expected a label key"));
        assert!(detail("replicas>3").contains("numeric comparison"));
        assert!(detail("env=pr od").contains("expected ','"));
        assert!(
            detail("env=-prod").contains("start and end"),
            "{}",
            detail("env=-prod")
        );
        assert!(detail("Bad_Prefix/x=y").contains("prefix"));
        assert!(detail("!").contains("after '!'"));
        let message = LabelSelector::parse("a=b,c in (d").unwrap_err().to_string();
        assert!(
            message.starts_with("invalid label selector in \"a=b,c in (d\""),
            "{message}"
        );
    }

    #[test]
    fn validate_checks_keys_values_and_operators() {
        let ok = sel("example.com/app=web-1,a.b_c-d=");
        ok.validate("app x").unwrap();
        let with = |key: &str, operator, values: Vec<&str>| LabelSelector {
            match_labels: BTreeMap::new(),
            match_expressions: vec![Requirement {
                key: key.to_owned(),
                operator,
                values: values.into_iter().map(str::to_owned).collect(),
            }],
        };
        let invalid = |s: LabelSelector| match s.validate("app x") {
            Err(Error::InvalidSelector { context, detail }) => {
                assert_eq!(context, "app x");
                detail
            }
            other => panic!("{other:?}"),
        };
        assert!(invalid(with("k", Operator::In, vec![])).contains("at least one value"));
        assert!(invalid(with("k", Operator::NotIn, vec![])).contains("at least one value"));
        assert!(invalid(with("k", Operator::Exists, vec!["x"])).contains("no values"));
        assert!(invalid(with("k", Operator::DoesNotExist, vec!["x"])).contains("no values"));
        for key in [
            "",
            "-a",
            "a-",
            "a b",
            "UPPER.com/x",
            "a/",
            "/a",
            "a/b/c",
            &"x".repeat(64),
        ] {
            invalid(with(key, Operator::Exists, vec![]));
        }
        let long_prefix = format!("{}/x", ["a".repeat(63).as_str(); 5].join("."));
        invalid(with(&long_prefix, Operator::Exists, vec![]));
        with(&format!("{}/x", "a".repeat(200)), Operator::Exists, vec![])
            .validate("")
            .unwrap();
        with(&"x".repeat(63), Operator::Exists, vec![])
            .validate("")
            .unwrap();
        for value in ["-x", "x-", "a b", "ü", &"v".repeat(64)] {
            invalid(with("k", Operator::In, vec![value]));
            let mut s = LabelSelector::default();
            s.match_labels.insert("k".to_owned(), value.to_owned());
            invalid(s);
        }
    }

    #[test]
    fn serde_uses_the_kubernetes_field_names() {
        let s = sel("env=prod,region in (eu),gpu");
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "matchLabels": {"env": "prod"},
                "matchExpressions": [
                    {"key": "region", "operator": "In", "values": ["eu"]},
                    {"key": "gpu", "operator": "Exists"},
                ]
            })
        );
        assert_eq!(serde_json::from_value::<LabelSelector>(json).unwrap(), s);
        assert_eq!(
            serde_json::to_value(LabelSelector::default()).unwrap(),
            serde_json::json!({})
        );
        assert!(
            serde_json::from_value::<LabelSelector>(serde_json::json!({"matchLabel": {}})).is_err()
        );
        assert!(
            serde_json::from_value::<LabelSelector>(
                serde_json::json!({"matchExpressions": [{"key": "a", "operator": "in"}]})
            )
            .is_err()
        );
    }

    #[test]
    fn label_assignments() {
        assert_eq!(
            parse_label_assignment("env=prod").unwrap(),
            ("env".to_owned(), "prod".to_owned())
        );
        assert_eq!(
            parse_label_assignment("topology.kubernetes.io/region=eu-west-1").unwrap(),
            (
                "topology.kubernetes.io/region".to_owned(),
                "eu-west-1".to_owned()
            )
        );
        assert_eq!(
            parse_label_assignment("gpu=").unwrap(),
            ("gpu".to_owned(), String::new())
        );
        for bad in ["env", "=prod", "env=pr od", "env=a=b", "bad key=x"] {
            let err = parse_label_assignment(bad).unwrap_err();
            assert!(matches!(err, Error::InvalidSelector { .. }), "{bad}: {err}");
        }
    }
}
