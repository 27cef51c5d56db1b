//! YAML and JSON manifest text to [`serde_json::Value`]s, refusing whatever a YAML 1.1 reader and a YAML 1.2
//! reader would read differently.
//!
//! Where the data comes from: the files of a fleet source tree ([`crate::source`] reads `fleet.yaml` and every
//! manifest through here). Where it goes: the values become [`crate::bundle::Manifest`] objects and the fleet
//! configuration, and end up, rendered, on clusters.
//!
//! Why refuse: a release engineer checks a manifest with `kubectl`, which reads YAML through
//! `sigs.k8s.io/yaml` and go-yaml v2, mostly as YAML 1.1. Windvane reads the YAML 1.2 core schema. If the two
//! readings of a file differ (`mode: 0644` is 420 to kubectl and 644 to a 1.2 reader; `on:` is the key `true`
//! to kubectl), whichever one Windvane picked would surprise someone, so such a scalar is an
//! [`Error::AmbiguousYaml`] that says what to write instead. What is refused, for plain (unquoted, untagged)
//! scalars, keys included:
//!
//! - `yes`, `no`, `on`, `off`, `y`, `n` in any case (1.1 booleans);
//! - integers with a leading zero such as `0644` or `-012` (1.1 octal);
//! - `0b1010` (1.1 binary), a sign before `0x`/`0o`, and upper-case `0X`/`0O`/`0B` prefixes;
//! - numbers with `_`, such as `1_000` (1.1 ignores the `_`);
//! - base-60 numbers such as `1:30` or `190:20:30`;
//! - `<<` merge keys (1.1 merges a mapping in; 1.2 has no merge keys).
//!
//! Resolution otherwise follows the YAML 1.2 core schema: `~`, `null`, `Null`, `NULL` and the empty scalar are
//! null; `true`/`True`/`TRUE`/`false`/`False`/`FALSE` are booleans; `[-+]?[0-9]+`, `0o[0-7]+` and
//! `0x[0-9a-fA-F]+` are integers; the core float form is a float (`.inf` and `.nan` are refused: JSON cannot
//! hold them); everything else, and every quoted or block scalar, is a string. A float with no fractional part
//! (`1.0`) becomes the integer `1`, as kubectl sends it, so that a Kubernetes integer field accepts it. The tags
//! `!!str`, `!!int`, `!!float`, `!!bool`, `!!null`, `!!map` and `!!seq` are honoured; any other tag is refused.
//! Mapping keys must be scalars and are turned into strings; a key given twice in one mapping is refused.
//! Aliases are expanded, and every node an alias expands to counts toward [`YamlLimits::max_nodes`], so that a
//! "billion laughs" file fails fast instead of exhausting memory.

use std::collections::HashMap;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};
use yaml_rust2::parser::{Event, Parser, Tag};
use yaml_rust2::scanner::{Marker, TScalarStyle};

use crate::{Error, Result};

/// Caps on what one YAML stream may expand to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct YamlLimits {
    /// Most nodes (scalars, keys, sequences, mappings) one stream may produce, counting every node that an
    /// alias expands to. Caps alias expansion ("billion laughs").
    pub max_nodes: usize,
    /// Deepest nesting of sequences and mappings.
    pub max_depth: usize,
}

impl Default for YamlLimits {
    fn default() -> Self {
        Self {
            max_nodes: 1_000_000,
            max_depth: 256,
        }
    }
}

/// Reads every non-empty document of a (multi-document) YAML stream as JSON, each with its index in the
/// stream. Indexes count from 0 and include the empty documents that are skipped, so that they match what
/// the user sees when counting `---` separators. A document that is only `null` counts as empty. `file` names
/// the source in errors.
pub fn documents_to_json(
    text: &str,
    file: &str,
    limits: YamlLimits,
) -> Result<Vec<(usize, Value)>> {
    // yaml-rust2 does not skip a byte-order mark; editors on some platforms write one.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut builder = Builder::new(file, limits);
    let mut parser = Parser::new_from_str(text);
    // Pulling events one by one (rather than `Parser::load`, which recurses per nesting level) keeps a deeply
    // nested hostile file from overflowing the stack: the depth cap is checked here before anything recurses.
    loop {
        let (event, mark) = parser.next_token().map_err(|e| {
            let at = e.marker();
            Error::Parse {
                file: file.to_owned(),
                detail: format!("{}: {}", position(at), e.info()),
            }
        })?;
        if event == Event::StreamEnd {
            break;
        }
        builder.on_event(event, mark)?;
    }
    Ok(builder.documents)
}

/// Reads a JSON file: exactly one value, with no trailing content. A key given twice in one object is refused
/// (most JSON readers silently keep the last one, which hides mistakes). Like YAML, a float with no fractional
/// part becomes an integer.
pub fn json_to_value(text: &str, file: &str) -> Result<Value> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let strict: StrictValue = serde_json::from_str(text).map_err(|e| Error::Parse {
        file: file.to_owned(),
        detail: e.to_string(),
    })?;
    Ok(strict.0)
}

/// "line L, column C" with a 1-based column (yaml-rust2 counts columns from 0, lines from 1).
fn position(mark: &Marker) -> String {
    format!("line {}, column {}", mark.line(), mark.col() + 1)
}

/// Builds JSON values from parser events. Collections under construction live on an explicit stack.
struct Builder<'a> {
    file: &'a str,
    limits: YamlLimits,
    /// Nodes produced so far in this stream, alias expansions included.
    nodes: usize,
    stack: Vec<Frame>,
    /// Completed anchored nodes of the current document, with how many nodes each expands to.
    anchors: HashMap<usize, (Value, usize)>,
    root: Option<Value>,
    document_index: usize,
    documents: Vec<(usize, Value)>,
}

struct Frame {
    anchor: usize,
    /// `Builder::nodes` when this collection started, to know how many nodes an alias to it expands to.
    nodes_before: usize,
    kind: FrameKind,
}

enum FrameKind {
    Sequence(Vec<Value>),
    Mapping {
        map: Map<String, Value>,
        /// The key read and waiting for its value; `None` when the next node is a key.
        pending_key: Option<String>,
        /// Line of each key, to name both places when a key repeats.
        key_lines: HashMap<String, usize>,
    },
}

impl<'a> Builder<'a> {
    fn new(file: &'a str, limits: YamlLimits) -> Self {
        Self {
            file,
            limits,
            nodes: 0,
            stack: Vec::new(),
            anchors: HashMap::new(),
            root: None,
            document_index: 0,
            documents: Vec::new(),
        }
    }

    fn parse_error(&self, mark: &Marker, detail: impl std::fmt::Display) -> Error {
        Error::Parse {
            file: self.file.to_owned(),
            detail: format!("{}: {detail}", position(mark)),
        }
    }

    fn on_event(&mut self, event: Event, mark: Marker) -> Result<()> {
        match event {
            Event::Nothing | Event::StreamStart | Event::StreamEnd => Ok(()),
            Event::DocumentStart => {
                // Anchors are scoped to their document.
                self.anchors.clear();
                self.stack.clear();
                self.root = None;
                Ok(())
            }
            Event::DocumentEnd => {
                if let Some(value) = self.root.take()
                    && !value.is_null()
                {
                    self.documents.push((self.document_index, value));
                }
                self.document_index += 1;
                Ok(())
            }
            Event::Scalar(text, style, anchor, tag) => {
                self.on_scalar(&text, style, anchor, tag.as_ref(), mark)
            }
            Event::Alias(id) => self.on_alias(id, mark),
            Event::SequenceStart(anchor, tag) => {
                self.check_collection_tag(tag.as_ref(), "seq", &mark)?;
                self.start(anchor, FrameKind::Sequence(Vec::new()), &mark)
            }
            Event::MappingStart(anchor, tag) => {
                self.check_collection_tag(tag.as_ref(), "map", &mark)?;
                let kind = FrameKind::Mapping {
                    map: Map::new(),
                    pending_key: None,
                    key_lines: HashMap::new(),
                };
                self.start(anchor, kind, &mark)
            }
            Event::SequenceEnd | Event::MappingEnd => self.end(&mark),
        }
    }

    fn count(&mut self, nodes: usize, mark: &Marker) -> Result<()> {
        self.nodes = self.nodes.saturating_add(nodes);
        if self.nodes > self.limits.max_nodes {
            return Err(self.parse_error(
                mark,
                format!(
                    "more than {} nodes (aliases expanding to too much data?); the cap protects every reader",
                    self.limits.max_nodes
                ),
            ));
        }
        Ok(())
    }

    /// True when the next node completes a key of the innermost mapping.
    fn expecting_key(&self) -> bool {
        matches!(
            self.stack.last(),
            Some(Frame {
                kind: FrameKind::Mapping {
                    pending_key: None,
                    ..
                },
                ..
            })
        )
    }

    fn check_collection_tag(&self, tag: Option<&Tag>, expected: &str, mark: &Marker) -> Result<()> {
        match tag {
            None => Ok(()),
            Some(tag) if core_tag(tag) == Some(expected) => Ok(()),
            Some(tag) => Err(self.parse_error(mark, unsupported_tag(tag))),
        }
    }

    fn start(&mut self, anchor: usize, kind: FrameKind, mark: &Marker) -> Result<()> {
        if self.expecting_key() {
            return Err(self.parse_error(
                mark,
                "a mapping key must be a scalar, not a sequence or mapping",
            ));
        }
        if self.stack.len() >= self.limits.max_depth {
            return Err(self.parse_error(
                mark,
                format!("nested deeper than {} levels", self.limits.max_depth),
            ));
        }
        self.count(1, mark)?;
        self.stack.push(Frame {
            anchor,
            nodes_before: self.nodes - 1,
            kind,
        });
        Ok(())
    }

    fn end(&mut self, mark: &Marker) -> Result<()> {
        let Some(frame) = self.stack.pop() else {
            return Err(self.parse_error(mark, "unbalanced end of a collection"));
        };
        let value = match frame.kind {
            FrameKind::Sequence(items) => Value::Array(items),
            FrameKind::Mapping { map, .. } => Value::Object(map),
        };
        if frame.anchor > 0 {
            self.anchors.insert(
                frame.anchor,
                (value.clone(), self.nodes - frame.nodes_before),
            );
        }
        self.attach(value, mark)
    }

    fn on_scalar(
        &mut self,
        text: &str,
        style: TScalarStyle,
        anchor: usize,
        tag: Option<&Tag>,
        mark: Marker,
    ) -> Result<()> {
        let is_key = self.expecting_key();
        let value = self.resolve_scalar(text, style, tag, is_key, &mark)?;
        self.count(1, &mark)?;
        if anchor > 0 {
            self.anchors.insert(anchor, (value.clone(), 1));
        }
        if is_key {
            self.set_key(value, &mark)
        } else {
            self.attach(value, &mark)
        }
    }

    fn on_alias(&mut self, id: usize, mark: Marker) -> Result<()> {
        let Some(nodes) = self.anchors.get(&id).map(|(_, nodes)| *nodes) else {
            // The parser has already resolved the name, so the anchor exists but is not complete yet.
            return Err(self.parse_error(
                &mark,
                "an alias refers to a node that contains it (a recursive alias)",
            ));
        };
        // Count before cloning, so that an expansion over the cap is never materialised.
        self.count(nodes, &mark)?;
        let value = self
            .anchors
            .get(&id)
            .map_or(Value::Null, |(value, _)| value.clone());
        if self.expecting_key() {
            self.set_key(value, &mark)
        } else {
            self.attach(value, &mark)
        }
    }

    /// Records a mapping key (a resolved scalar) after turning it into a string and checking it is new.
    fn set_key(&mut self, key: Value, mark: &Marker) -> Result<()> {
        let key = match key {
            Value::String(s) => s,
            Value::Bool(_) | Value::Number(_) => key.to_string(),
            Value::Null => {
                return Err(self.parse_error(
                    mark,
                    "a mapping key is null; quote it if it is meant as text",
                ));
            }
            Value::Array(_) | Value::Object(_) => {
                return Err(self.parse_error(
                    mark,
                    "a mapping key must be a scalar, not a sequence or mapping",
                ));
            }
        };
        let line = mark.line();
        let duplicate = match self.stack.last_mut() {
            Some(Frame {
                kind:
                    FrameKind::Mapping {
                        pending_key,
                        key_lines,
                        ..
                    },
                ..
            }) => match key_lines.insert(key.clone(), line) {
                Some(first) => Some(first),
                None => {
                    *pending_key = Some(key.clone());
                    None
                }
            },
            _ => return Err(self.parse_error(mark, "a key outside a mapping")),
        };
        match duplicate {
            Some(first) => Err(self.parse_error(
                mark,
                format!("duplicate key {key:?} (first on line {first}); a mapping may give a key only once"),
            )),
            None => Ok(()),
        }
    }

    fn attach(&mut self, value: Value, mark: &Marker) -> Result<()> {
        match self.stack.last_mut() {
            None => {
                self.root = Some(value);
                Ok(())
            }
            Some(Frame {
                kind: FrameKind::Sequence(items),
                ..
            }) => {
                items.push(value);
                Ok(())
            }
            Some(Frame {
                kind:
                    FrameKind::Mapping {
                        map, pending_key, ..
                    },
                ..
            }) => match pending_key.take() {
                Some(key) => {
                    map.insert(key, value);
                    Ok(())
                }
                None => Err(self.parse_error(mark, "a mapping value without a key")),
            },
        }
    }

    fn ambiguous(&self, mark: &Marker, value: &str, reading: Reading11) -> Error {
        Error::AmbiguousYaml {
            file: self.file.to_owned(),
            line: mark.line(),
            column: mark.col() + 1,
            value: value.to_owned(),
            detail: reading.detail,
            suggestion: reading.suggestion,
        }
    }

    fn resolve_scalar(
        &self,
        text: &str,
        style: TScalarStyle,
        tag: Option<&Tag>,
        is_key: bool,
        mark: &Marker,
    ) -> Result<Value> {
        let Some(tag) = tag else {
            if style != TScalarStyle::Plain {
                return Ok(Value::String(text.to_owned()));
            }
            if let Some(reading) = yaml11_reading(text, is_key) {
                return Err(self.ambiguous(mark, text, reading));
            }
            return self.core_value(text, mark);
        };
        let Some(kind) = core_tag(tag) else {
            return Err(self.parse_error(mark, unsupported_tag(tag)));
        };
        if kind == "str" {
            return Ok(Value::String(text.to_owned()));
        }
        if !matches!(kind, "null" | "bool" | "int" | "float") {
            return Err(self.parse_error(mark, unsupported_tag(tag)));
        }
        // An explicit `!!int 0644` is still read as octal by a 1.1 reader.
        if let Some(reading) = yaml11_reading(text, false) {
            return Err(self.ambiguous(mark, text, reading));
        }
        let value = self.core_value(text, mark)?;
        let fits = match kind {
            "null" => value.is_null(),
            "bool" => value.is_boolean(),
            "int" => value.is_i64() || value.is_u64(),
            // Core schema: an integer literal is a valid float too.
            _ => value.is_number(),
        };
        if fits {
            Ok(value)
        } else {
            Err(self.parse_error(
                mark,
                format!("{text:?} is not a valid !!{kind} in the YAML 1.2 core schema"),
            ))
        }
    }

    /// Resolves an untagged plain scalar by the YAML 1.2 core schema.
    fn core_value(&self, text: &str, mark: &Marker) -> Result<Value> {
        match core_kind(text) {
            CoreKind::Null => Ok(Value::Null),
            CoreKind::Bool(b) => Ok(Value::Bool(b)),
            CoreKind::Int { negative, digits, radix } => {
                let parsed = u64::from_str_radix(digits, radix).ok().and_then(|magnitude| {
                    if negative {
                        0i64.checked_sub_unsigned(magnitude).map(Value::from)
                    } else {
                        Some(Value::from(magnitude))
                    }
                });
                parsed.ok_or_else(|| {
                    self.parse_error(
                        mark,
                        format!("the integer {text} does not fit in 64 bits; quote it if it is meant as text"),
                    )
                })
            }
            CoreKind::Float => match text.parse::<f64>() {
                Ok(f) if f.is_finite() => Ok(float_value(f)),
                _ => Err(self.parse_error(mark, format!("the number {text} is too large for JSON"))),
            },
            CoreKind::NotFinite => Err(self.parse_error(
                mark,
                format!("{text} (infinity or not-a-number) cannot be represented in JSON; quote it for a string"),
            )),
            CoreKind::Str => Ok(Value::String(text.to_owned())),
        }
    }
}

/// A JSON number for a finite float: integral values within the exactly-representable range become integers,
/// as Go's JSON encoder (and so kubectl) writes them.
fn float_value(f: f64) -> Value {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    if f.fract() == 0.0 && f.abs() < EXACT {
        // The range check above makes the conversion exact.
        #[allow(clippy::cast_possible_truncation)]
        return Value::from(f as i64);
    }
    Number::from_f64(f).map_or(Value::Null, Value::Number)
}

/// The suffix of a `tag:yaml.org,2002:` tag (`!!str` → `str`), or `None` for any other tag.
fn core_tag(tag: &Tag) -> Option<&str> {
    const PREFIX: &str = "tag:yaml.org,2002:";
    if tag.handle == PREFIX {
        Some(tag.suffix.as_str())
    } else if tag.handle.is_empty() || tag.handle == "!" {
        tag.suffix.strip_prefix(PREFIX)
    } else {
        None
    }
}

fn unsupported_tag(tag: &Tag) -> String {
    let shown = match core_tag(tag) {
        Some(suffix) => format!("!!{suffix}"),
        None if tag.handle.is_empty() || tag.handle == "!" => {
            format!("!{}", tag.suffix.trim_start_matches('!'))
        }
        None => format!("{}{}", tag.handle, tag.suffix),
    };
    format!(
        "tag {shown} is not supported here; use !!str, !!int, !!float, !!bool, !!null, !!map or !!seq, or no tag"
    )
}

/// How the YAML 1.2 core schema reads a plain scalar.
#[derive(Debug, PartialEq)]
enum CoreKind<'t> {
    Null,
    Bool(bool),
    Int {
        negative: bool,
        digits: &'t str,
        radix: u32,
    },
    Float,
    NotFinite,
    Str,
}

fn core_kind(text: &str) -> CoreKind<'_> {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return CoreKind::Null,
        "true" | "True" | "TRUE" => return CoreKind::Bool(true),
        "false" | "False" | "FALSE" => return CoreKind::Bool(false),
        ".nan" | ".NaN" | ".NAN" => return CoreKind::NotFinite,
        _ => {}
    }
    if let Some(digits) = text.strip_prefix("0o")
        && is_digits(digits, 8)
    {
        return CoreKind::Int {
            negative: false,
            digits,
            radix: 8,
        };
    }
    if let Some(digits) = text.strip_prefix("0x")
        && is_digits(digits, 16)
    {
        return CoreKind::Int {
            negative: false,
            digits,
            radix: 16,
        };
    }
    let (negative, unsigned) = split_sign(text);
    if is_digits(unsigned, 10) {
        return CoreKind::Int {
            negative,
            digits: unsigned,
            radix: 10,
        };
    }
    if matches!(unsigned, ".inf" | ".Inf" | ".INF") {
        return CoreKind::NotFinite;
    }
    if is_core_float(unsigned) {
        CoreKind::Float
    } else {
        CoreKind::Str
    }
}

/// `(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?`, the sign already removed.
fn is_core_float(text: &str) -> bool {
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(at) => (&text[..at], Some(&text[at + 1..])),
        None => (text, None),
    };
    let mantissa_ok = match mantissa.split_once('.') {
        Some(("", fraction)) => is_digits(fraction, 10),
        Some((whole, fraction)) => {
            is_digits(whole, 10) && (fraction.is_empty() || is_digits(fraction, 10))
        }
        None => is_digits(mantissa, 10),
    };
    let exponent_ok = exponent.is_none_or(|e| is_digits(split_sign(e).1, 10));
    mantissa_ok && exponent_ok
}

/// Non-empty and every character a digit of `radix`.
fn is_digits(text: &str, radix: u32) -> bool {
    !text.is_empty() && text.chars().all(|c| c.is_digit(radix))
}

/// `(is the sign a minus, the rest)`.
fn split_sign(text: &str) -> (bool, &str) {
    if let Some(rest) = text.strip_prefix('-') {
        (true, rest)
    } else {
        (false, text.strip_prefix('+').unwrap_or(text))
    }
}

/// How a YAML 1.1 reader reads a plain scalar that a 1.2 reader reads otherwise.
#[derive(Debug)]
struct Reading11 {
    detail: String,
    suggestion: String,
}

/// `Some` when a YAML 1.1 reader (go-yaml v2, and so kubectl, or the 1.1 spec) reads `text` differently
/// from the YAML 1.2 core schema.
fn yaml11_reading(text: &str, is_key: bool) -> Option<Reading11> {
    let quoted = format!("{text:?} (quoted)");
    if let Some(reading) = boolean11(text, is_key, &quoted) {
        return Some(reading);
    }
    if text == "<<" && is_key {
        return Some(Reading11 {
            detail:
                "a YAML 1.1 reader merges the aliased mapping in here; YAML 1.2 has no merge keys"
                    .to_owned(),
            suggestion: "the merged fields out in full in this mapping instead of <<".to_owned(),
        });
    }
    if text.contains('_') {
        // A number with underscores or nothing: none of the readings below has one.
        return underscored11(text, &quoted);
    }
    let (negative, body) = split_sign(text);
    let signed = text.len() != body.len();
    prefixed11(body, negative, signed, &quoted)
        .or_else(|| leading_zero11(body, negative, &quoted))
        .or_else(|| {
            let sign = if negative { "-" } else { "" };
            sexagesimal(body).map(|number| Reading11 {
                detail: format!(
                    "YAML 1.1 reads it as the base-60 number {sign}{number}, YAML 1.2 reads a string"
                ),
                suggestion: format!("{quoted} for the string"),
            })
        })
}

/// `yes`/`no`/`on`/`off`/`y`/`n` in any case: booleans to YAML 1.1.
fn boolean11(text: &str, is_key: bool, quoted: &str) -> Option<Reading11> {
    let truth = match text.to_ascii_lowercase().as_str() {
        "yes" | "on" | "y" => true,
        "no" | "off" | "n" => false,
        _ => return None,
    };
    Some(if is_key {
        Reading11 {
            detail: format!(
                "a YAML 1.1 reader such as kubectl reads this key as the boolean {truth}"
            ),
            suggestion: format!("{quoted} for the key"),
        }
    } else {
        Reading11 {
            detail: format!("YAML 1.1 reads it as the boolean {truth}, YAML 1.2 as a string"),
            suggestion: format!("{quoted} for the string, or {truth} for the boolean"),
        }
    })
}

/// A number with `_` separators, which YAML 1.1 ignores.
fn underscored11(text: &str, quoted: &str) -> Option<Reading11> {
    let number = number11(&text.replace('_', ""))?;
    Some(Reading11 {
        detail: format!(
            "YAML 1.1 ignores the _ and reads the number {number}, YAML 1.2 reads a string"
        ),
        suggestion: format!("{number} for the number, or {quoted} for the string"),
    })
}

/// `0b…` in any form, and signed or upper-case `0o…`/`0x…`: numbers to YAML 1.1 (as Go reads them), strings
/// to the 1.2 core schema.
fn prefixed11(body: &str, negative: bool, signed: bool, quoted: &str) -> Option<Reading11> {
    let (prefix, digits) = body.split_at_checked(2)?;
    let radix = match prefix {
        "0b" | "0B" => 2,
        "0o" | "0O" => 8,
        "0x" | "0X" => 16,
        _ => return None,
    };
    // Go reads a signed or upper-case prefix as a number too; the 1.2 core schema does not.
    let differs = radix == 2 || signed || prefix.ends_with(|c: char| c.is_ascii_uppercase());
    if !is_digits(digits, radix) || !differs {
        return None;
    }
    let sign = if negative { "-" } else { "" };
    let number =
        magnitude(digits, radix).map_or_else(|| "a number".to_owned(), |m| format!("{sign}{m}"));
    let what = if radix == 2 {
        "binary number"
    } else {
        "number"
    };
    Some(Reading11 {
        detail: format!(
            "YAML 1.1 (kubectl) reads it as the {what} {number}, YAML 1.2 reads a string"
        ),
        suggestion: format!("{number} for the number, or {quoted} for the string"),
    })
}

/// Digits with a leading zero: octal to YAML 1.1 when they can be, never the decimal YAML 1.2 reads.
fn leading_zero11(body: &str, negative: bool, quoted: &str) -> Option<Reading11> {
    if body.len() < 2 || !body.starts_with('0') || !is_digits(body, 10) {
        return None;
    }
    let sign = if negative { "-" } else { "" };
    let decimal = body.trim_start_matches('0');
    let decimal = if decimal.is_empty() { "0" } else { decimal };
    if !is_digits(body, 8) {
        return Some(Reading11 {
            detail: format!(
                "a leading zero: YAML 1.1 does not read it as the decimal {sign}{decimal}, YAML 1.2 does"
            ),
            suggestion: format!("{sign}{decimal} for the number, or {quoted} for the string"),
        });
    }
    let octal = magnitude(body, 8).map_or_else(|| "a large number".to_owned(), |m| m.to_string());
    let suggestion = if negative {
        format!(
            "-{octal} for the octal value, -{decimal} for the decimal, or {quoted} for the string"
        )
    } else {
        format!("0o{decimal} for the octal number {octal}, or {quoted} for the string")
    };
    Some(Reading11 {
        detail: format!(
            "YAML 1.1 reads it as the octal number {sign}{octal}, YAML 1.2 as the decimal {sign}{decimal}"
        ),
        suggestion,
    })
}

/// The value of `digits` in `radix`, when it fits in 128 bits.
fn magnitude(digits: &str, radix: u32) -> Option<u128> {
    u128::from_str_radix(digits, radix).ok()
}

/// The number a YAML 1.1 reader sees in `text` (underscores already removed), as text, if any.
fn number11(text: &str) -> Option<String> {
    let (negative, body) = split_sign(text);
    let sign = if negative { "-" } else { "" };
    if let Some((prefix, digits)) = body.split_at_checked(2) {
        let radix = match prefix.to_ascii_lowercase().as_str() {
            "0b" => Some(2),
            "0o" => Some(8),
            "0x" => Some(16),
            _ => None,
        };
        if let Some(radix) = radix
            && is_digits(digits, radix)
        {
            return magnitude(digits, radix).map(|m| format!("{sign}{m}"));
        }
    }
    if body.len() >= 2 && body.starts_with('0') && is_digits(body, 8) {
        return magnitude(body, 8).map(|m| format!("{sign}{m}"));
    }
    if is_digits(body, 10) || is_core_float(body) {
        return Some(text.trim_start_matches('+').to_owned());
    }
    sexagesimal(body).map(|n| format!("{sign}{n}"))
}

/// YAML 1.1 base 60: `[1-9][0-9]*(:[0-5]?[0-9])+` (int) or `[0-9][0-9]*(:[0-5]?[0-9])+\.[0-9]*` (float), sign
/// removed. Returns the value as text.
fn sexagesimal(text: &str) -> Option<String> {
    let (whole, fraction) = match text.split_once('.') {
        Some((whole, fraction)) => (whole, Some(fraction)),
        None => (text, None),
    };
    let mut parts = whole.split(':');
    let first = parts.next()?;
    if !is_digits(first, 10) || (fraction.is_none() && first.starts_with('0')) {
        return None;
    }
    let rest: Vec<&str> = parts.collect();
    if rest.is_empty() {
        return None;
    }
    let mut value = first.parse::<u128>().ok()?;
    for part in rest {
        let valid = match part.as_bytes() {
            [d] => d.is_ascii_digit(),
            [t, d] => (b'0'..=b'5').contains(t) && d.is_ascii_digit(),
            _ => false,
        };
        if !valid {
            return None;
        }
        value = value
            .checked_mul(60)?
            .checked_add(part.parse::<u128>().ok()?)?;
    }
    match fraction {
        None => Some(value.to_string()),
        Some(f) if f.is_empty() || is_digits(f, 10) => Some(format!("{value}.{f}")),
        Some(_) => None,
    }
}

/// A JSON value read with duplicate keys refused and integral floats made integers.
struct StrictValue(Value);

impl<'de> Deserialize<'de> for StrictValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        deserializer.deserialize_any(StrictVisitor).map(StrictValue)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> std::result::Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> std::result::Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> std::result::Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<Value, E> {
        if v.is_finite() {
            Ok(float_value(v))
        } else {
            Err(E::custom("number out of range"))
        }
    }

    fn visit_str<E>(self, v: &str) -> std::result::Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> std::result::Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> std::result::Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> std::result::Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(StrictValue(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> std::result::Result<Value, A::Error> {
        let mut map = Map::new();
        while let Some(key) = access.next_key::<String>()? {
            if map.contains_key(&key) {
                return Err(de::Error::custom(format!("duplicate key {key:?}")));
            }
            let StrictValue(value) = access.next_value()?;
            map.insert(key, value);
        }
        Ok(Value::Object(map))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn one(text: &str) -> Value {
        let docs = documents_to_json(text, "t.yaml", YamlLimits::default()).unwrap();
        assert_eq!(docs.len(), 1, "{docs:?}");
        docs.into_iter()
            .next()
            .map(|(_, v)| v)
            .unwrap_or(Value::Null)
    }

    fn value_of(scalar: &str) -> Value {
        one(&format!("v: {scalar}\n"))["v"].clone()
    }

    fn err(text: &str) -> Error {
        documents_to_json(text, "t.yaml", YamlLimits::default()).unwrap_err()
    }

    fn ambiguous(text: &str) -> (usize, usize, String, String) {
        match err(text) {
            Error::AmbiguousYaml {
                file,
                line,
                column,
                value,
                suggestion,
                ..
            } => {
                assert_eq!(file, "t.yaml");
                (line, column, value, suggestion)
            }
            other => panic!("{text}: expected AmbiguousYaml, got {other}"),
        }
    }

    #[test]
    fn core_schema_nulls_and_bools() {
        for null in ["~", "null", "Null", "NULL", ""] {
            assert_eq!(value_of(null), Value::Null, "{null:?}");
        }
        for t in ["true", "True", "TRUE"] {
            assert_eq!(value_of(t), json!(true));
        }
        for f in ["false", "False", "FALSE"] {
            assert_eq!(value_of(f), json!(false));
        }
        // Not core-schema booleans or nulls, and not 1.1 ones either: strings for everyone.
        for s in ["tRUE", "nULL", "none", "nil"] {
            assert_eq!(value_of(s), json!(s));
        }
    }

    #[test]
    fn core_schema_numbers() {
        assert_eq!(value_of("42"), json!(42));
        assert_eq!(value_of("-17"), json!(-17));
        assert_eq!(value_of("+5"), json!(5));
        assert_eq!(value_of("0"), json!(0));
        assert_eq!(value_of("0o644"), json!(420));
        assert_eq!(value_of("0x1F"), json!(31));
        assert_eq!(value_of("18446744073709551615"), json!(u64::MAX));
        assert_eq!(value_of("-9223372036854775808"), json!(i64::MIN));
        assert_eq!(value_of("1.5"), json!(1.5));
        assert_eq!(value_of("-.5"), json!(-0.5));
        assert_eq!(value_of("2.5e3"), json!(2500));
        assert_eq!(value_of("1e-2"), json!(0.01));
        // Integral floats are sent as integers, as kubectl does.
        assert_eq!(value_of("3.0"), json!(3));
        assert_eq!(value_of("1."), json!(1));
        for s in [
            "1.2.3", "0x", "0xZZ", "1e", "e5", "--1", "12a", "0.5.1", "v1",
        ] {
            assert_eq!(value_of(s), json!(s), "{s}");
        }
    }

    #[test]
    fn numbers_json_cannot_hold_are_refused() {
        for bad in [
            ".inf",
            "-.Inf",
            "+.INF",
            ".nan",
            ".NaN",
            "1e400",
            "18446744073709551616",
            "-9223372036854775809",
        ] {
            assert!(
                matches!(err(&format!("v: {bad}\n")), Error::Parse { .. }),
                "{bad}"
            );
        }
        assert_eq!(value_of("\".inf\""), json!(".inf"));
    }

    #[test]
    fn quoted_and_block_scalars_are_strings() {
        assert_eq!(value_of("\"0644\""), json!("0644"));
        assert_eq!(value_of("'on'"), json!("on"));
        assert_eq!(value_of("\"true\""), json!("true"));
        assert_eq!(value_of("'1_000'"), json!("1_000"));
        assert_eq!(one("v: |\n  yes\n")["v"], json!("yes\n"));
        assert_eq!(one("v: >-\n  012\n")["v"], json!("012"));
    }

    #[test]
    fn yaml11_booleans_are_refused_with_a_suggestion() {
        for word in [
            "yes", "Yes", "YES", "no", "No", "on", "On", "ON", "off", "OFF", "y", "Y", "n", "N",
            "yEs",
        ] {
            let (line, column, value, suggestion) = ambiguous(&format!("a: 1\nflag: {word}\n"));
            assert_eq!((line, column, value.as_str()), (2, 7, word));
            assert!(
                suggestion.contains(&format!("{word:?} (quoted)")),
                "{suggestion}"
            );
            let truth = matches!(word.to_ascii_lowercase().as_str(), "yes" | "on" | "y");
            assert!(
                suggestion.contains(&format!("or {truth} for the boolean")),
                "{suggestion}"
            );
        }
    }

    #[test]
    fn yaml11_boolean_keys_are_refused() {
        let (line, column, value, suggestion) = ambiguous("jobs:\n  on: push\n");
        assert_eq!((line, column, value.as_str()), (2, 3, "on"));
        assert_eq!(suggestion, "\"on\" (quoted) for the key");
        let Error::AmbiguousYaml { detail, .. } = err("on: push\n") else {
            panic!()
        };
        assert!(detail.contains("key as the boolean true"), "{detail}");
        assert_eq!(one("\"on\": push\n"), json!({"on": "push"}));
    }

    #[test]
    fn leading_zero_integers_are_refused() {
        let (line, column, value, suggestion) = ambiguous("spec:\n  mode: 0644\n");
        assert_eq!((line, column, value.as_str()), (2, 9, "0644"));
        assert_eq!(
            suggestion,
            "0o644 for the octal number 420, or \"0644\" (quoted) for the string"
        );
        let message = err("mode: 0644\n").to_string();
        assert!(
            message.starts_with("t.yaml:1:7: \"0644\" reads differently"),
            "{message}"
        );
        let (_, _, _, suggestion) = ambiguous("v: -012\n");
        assert_eq!(
            suggestion,
            "-10 for the octal value, -12 for the decimal, or \"-012\" (quoted) for the string"
        );
        let (_, _, _, suggestion) = ambiguous("v: 089\n");
        assert_eq!(
            suggestion,
            "89 for the number, or \"089\" (quoted) for the string"
        );
        // `!!int` does not make the octal question go away.
        ambiguous("v: !!int 0644\n");
        assert_eq!(value_of("\"0644\""), json!("0644"));
        assert_eq!(value_of("0o644"), json!(420));
        assert_eq!(value_of("0.5"), json!(0.5));
    }

    #[test]
    fn binary_underscore_and_prefix_forms_are_refused() {
        let (_, _, _, suggestion) = ambiguous("v: 0b1010\n");
        assert_eq!(
            suggestion,
            "10 for the number, or \"0b1010\" (quoted) for the string"
        );
        let (_, _, _, suggestion) = ambiguous("v: 1_000\n");
        assert_eq!(
            suggestion,
            "1000 for the number, or \"1_000\" (quoted) for the string"
        );
        let (_, _, _, suggestion) = ambiguous("v: 0x_FF\n");
        assert!(suggestion.starts_with("255 for the number"), "{suggestion}");
        let (_, _, _, suggestion) = ambiguous("v: -0x10\n");
        assert!(suggestion.starts_with("-16 for the number"), "{suggestion}");
        ambiguous("v: 0X10\n");
        ambiguous("v: +0o7\n");
        ambiguous("v: 1_000.5\n");
        assert_eq!(value_of("my_name"), json!("my_name"));
        assert_eq!(value_of("_"), json!("_"));
    }

    #[test]
    fn sexagesimal_is_refused() {
        for (text, n) in [
            ("1:30", "90"),
            ("190:20:30", "685230"),
            ("-1:30", "-90"),
            ("1:30.5", "90.5"),
        ] {
            let Error::AmbiguousYaml {
                detail, suggestion, ..
            } = err(&format!("v: {text}\n"))
            else {
                panic!("{text}")
            };
            assert!(detail.contains(&format!("base-60 number {n}")), "{detail}");
            assert_eq!(suggestion, format!("{text:?} (quoted) for the string"));
        }
        // Not base 60 in YAML 1.1 either.
        for s in ["8080:80", "01:30", "1:2:3:x", "12:345"] {
            assert_eq!(value_of(s), json!(s), "{s}");
        }
    }

    #[test]
    fn merge_keys_are_refused() {
        let Error::AmbiguousYaml {
            value,
            suggestion,
            line,
            ..
        } = err("base: &b {a: 1}\nx:\n  <<: *b\n  c: 2\n")
        else {
            panic!()
        };
        assert_eq!((value.as_str(), line), ("<<", 3));
        assert!(
            suggestion.contains("merged fields out in full"),
            "{suggestion}"
        );
        assert_eq!(value_of("<<"), json!("<<"));
    }

    #[test]
    fn tags() {
        assert_eq!(value_of("!!str 0644"), json!("0644"));
        assert_eq!(value_of("!!str yes"), json!("yes"));
        assert_eq!(value_of("!!int \"42\""), json!(42));
        assert_eq!(value_of("!!float 1"), json!(1));
        assert_eq!(value_of("!!float 1.25"), json!(1.25));
        assert_eq!(value_of("!!bool true"), json!(true));
        assert_eq!(value_of("!!null ~"), Value::Null);
        assert_eq!(value_of("!!null"), Value::Null);
        assert_eq!(one("v: !!map {a: 1}\n"), json!({"v": {"a": 1}}));
        assert_eq!(one("v: !!seq [1]\n"), json!({"v": [1]}));
        for bad in [
            "!!int abc",
            "!!bool 1",
            "!!null x",
            "!!binary aGk=",
            "!custom x",
            "! x",
            "!!timestamp 2001-12-14",
        ] {
            assert!(
                matches!(err(&format!("v: {bad}\n")), Error::Parse { .. }),
                "{bad}"
            );
        }
        assert!(matches!(err("v: !!set {a: 1}\n"), Error::Parse { .. }));
        assert!(matches!(err("v: !!map [1]\n"), Error::Parse { .. }));
        assert!(matches!(err("v: !!str [1]\n"), Error::Parse { .. }));
    }

    #[test]
    fn keys_become_strings_and_duplicates_are_refused() {
        assert_eq!(
            one("1: a\ntrue: b\n0x10: c\n"),
            json!({"1": "a", "true": "b", "16": "c"})
        );
        let Error::Parse { detail, .. } = err("a: 1\nb: 2\na: 3\n") else {
            panic!()
        };
        assert!(
            detail.contains("line 3")
                && detail.contains("\"a\"")
                && detail.contains("first on line 1"),
            "{detail}"
        );
        // Keys that differ only in spelling, but not as strings, are still duplicates.
        assert!(matches!(err("\"1\": a\n1: b\n"), Error::Parse { .. }));
        assert!(matches!(err("? [a]\n: b\n"), Error::Parse { .. }));
        assert!(matches!(err("~: a\n"), Error::Parse { .. }));
        // The same key in different mappings is fine.
        assert_eq!(
            one("a: {x: 1}\nb: {x: 2}\n"),
            json!({"a": {"x": 1}, "b": {"x": 2}})
        );
    }

    #[test]
    fn aliases_expand_within_the_cap() {
        assert_eq!(
            one("a: &x {k: [1, 2]}\nb: *x\n"),
            json!({"a": {"k": [1, 2]}, "b": {"k": [1, 2]}})
        );
        assert_eq!(
            one("a: &k name\n*k : v\n"),
            json!({"a": "name", "name": "v"})
        );
        let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            let prev = format!("*a{}", i - 1);
            bomb.push_str(&format!(
                "a{i}: &a{i} [{}]\n",
                [prev.as_str(); 10].join(", ")
            ));
        }
        let Error::Parse { detail, .. } = err(&bomb) else {
            panic!()
        };
        assert!(detail.contains("more than 1000000 nodes"), "{detail}");
        let small = YamlLimits {
            max_nodes: 10,
            max_depth: 256,
        };
        assert!(documents_to_json("a: &x [1, 2, 3]\nb: *x\nc: *x\n", "t", small).is_err());
    }

    #[test]
    fn depth_is_capped() {
        let shallow = YamlLimits {
            max_nodes: 1_000,
            max_depth: 3,
        };
        let Err(Error::Parse { detail, .. }) =
            documents_to_json("a: {b: {c: [1]}}\n", "t", shallow)
        else {
            panic!()
        };
        assert!(detail.contains("deeper than 3"), "{detail}");
        assert!(documents_to_json("a: {b: {c: 1}}\n", "t", shallow).is_ok());
        // A hostile nesting depth is an error, not a stack overflow (the parser has a cap of its own).
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(matches!(err(&deep), Error::Parse { .. }));
        let ok = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert_eq!(
            documents_to_json(&ok, "t", YamlLimits::default())
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn multi_document_indexes_count_empty_documents() {
        let docs = documents_to_json(
            "a: 1\n---\n---\n# only a comment\n---\nb: 2\n---\n~\n---\nc: 3\n",
            "t",
            YamlLimits::default(),
        )
        .unwrap();
        let indexes: Vec<usize> = docs.iter().map(|(i, _)| *i).collect();
        assert_eq!(indexes, vec![0, 3, 5]);
        assert_eq!(docs[1].1, json!({"b": 2}));
        assert!(
            documents_to_json("", "t", YamlLimits::default())
                .unwrap()
                .is_empty()
        );
        assert!(
            documents_to_json("# nothing\n", "t", YamlLimits::default())
                .unwrap()
                .is_empty()
        );
        let leading = documents_to_json("---\na: 1\n", "t", YamlLimits::default()).unwrap();
        assert_eq!(leading, vec![(0, json!({"a": 1}))]);
    }

    #[test]
    fn syntax_errors_name_the_file_and_position() {
        let Error::Parse { file, detail } = err("a: [1, 2\n") else {
            panic!()
        };
        assert_eq!(file, "t.yaml");
        assert!(detail.starts_with("line "), "{detail}");
        assert!(matches!(err("a: *nope\n"), Error::Parse { .. }));
        assert!(matches!(err("a: &x [*x]\n"), Error::Parse { .. }));
    }

    #[test]
    fn byte_order_mark_is_skipped() {
        assert_eq!(one("\u{feff}a: 1\n"), json!({"a": 1}));
        assert_eq!(
            json_to_value("\u{feff}{\"a\": 1}", "t.json").unwrap(),
            json!({"a": 1})
        );
    }

    #[test]
    fn json_files() {
        assert_eq!(
            json_to_value("{\"a\": [1, 2.0, \"0644\"], \"b\": null}", "t.json").unwrap(),
            json!({"a": [1, 2, "0644"], "b": null})
        );
        for bad in [
            "{\"a\": 1} {}",
            "{\"a\": 1, \"a\": 2}",
            "",
            "{a: 1}",
            "[1,]",
        ] {
            assert!(
                matches!(json_to_value(bad, "t.json"), Err(Error::Parse { .. })),
                "{bad}"
            );
        }
        let Err(Error::Parse { detail, .. }) = json_to_value("{\n \"a\": 1,\n \"a\": 2}", "t.json")
        else {
            panic!()
        };
        assert!(
            detail.contains("duplicate key \"a\"") && detail.contains("line 3"),
            "{detail}"
        );
    }
}
