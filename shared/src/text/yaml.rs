//! YAML and JSON manifest text to [`serde_json::Value`]s, read as kubectl and Helm read them.
//!
//! Where the data comes from: the files of a fleet source tree (`windvane_publisher::source` reads `fleet.yaml` and every
//! manifest through here), and the output of `helm template` and `kustomize build`. Where it goes: the values
//! become [`crate::format::bundle::Manifest`] objects and the fleet configuration, and end up, rendered, on clusters.
//!
//! Which reading: kubectl and Helm read YAML through `sigs.k8s.io/yaml` and go-yaml v2, with YAML 1.1 rules,
//! and a chart's output is written for them. So plain (unquoted, untagged) scalars resolve as go-yaml v2
//! resolves them ([`Resolution`]), exactly, which a differential test against the real Go parser checks:
//!
//! - `y`, `Y`, `yes`, `Yes`, `YES`, `on`, `On`, `ON`, `true`, `True`, `TRUE` are true; the same forms of `n`,
//!   `no`, `off`, `false` are false; `~`, `null`, `Null`, `NULL` and the empty scalar are null;
//! - a scalar starting with a digit or a sign is, with every `_` removed, an integer in Go's syntax when it is
//!   one (`0644` is the octal 420, `0x1F`, `0o17`, `0b101`, `-12`, `1_000` is 1000), else a float of the form
//!   `[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?`, else a string (`1:30`, `2024-01-01`);
//! - a scalar starting with `.` is a float when Go parses it as one (`.5`); `.inf` and `.nan` are refused (JSON
//!   cannot hold them); everything else, and every quoted or block scalar, is a string;
//! - a plain `<<` key merges the mapping (or list of mappings, earlier ones first) it is given into the
//!   mapping it is in, as go-yaml v2 does: its keys replace the ones written before it, keys after it win.
//!
//! A float with no fractional part (`1.0`) becomes the integer `1`, as Go's JSON encoder writes it. The tags
//! `!!str`, `!!int`, `!!float`, `!!bool`, `!!null`, `!!map` and `!!seq` are honoured; any other tag is refused.
//! Mapping keys must be scalars and become strings (`on:` is the key `"true"`, as kubectl reads it); a key
//! written twice in one mapping is refused (go-yaml silently keeps the last one, which hides mistakes).
//!
//! Where that reading differs from a YAML 1.2 reader's (the form most editors and linters assume), the reader
//! records a [`YamlWarning`] naming the file, line and both readings; with [`Yaml11::Refuse`] (`windvane build
//! --strict`, and the configuration files Windvane itself reads) the same is an [`Error::AmbiguousYaml`].
//!
//! Aliases are expanded, and every node and byte an alias expands to counts toward [`YamlLimits::max_nodes`]
//! and [`YamlLimits::max_bytes`], so that a "billion laughs" file, or a large anchor aliased many times, fails
//! fast instead of exhausting memory.

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
    /// Most bytes of scalar text one stream may produce, alias expansions included, with [`NODE_BYTES`] more
    /// per node: what the values take in memory grows with this, not with the node count (one 7 MiB anchor
    /// aliased 250 000 times is 1.7 TB in few nodes).
    pub max_bytes: usize,
}

/// What each node counts toward [`YamlLimits::max_bytes`] besides its text: a floor on its size in memory.
pub const NODE_BYTES: usize = 16;

impl Default for YamlLimits {
    fn default() -> Self {
        Self {
            max_nodes: 1_000_000,
            max_depth: 256,
            // Twice the largest engine output (`windvane_publisher::source` caps a file at 8 MiB; helm and kustomize may
            // print up to 64 MiB), so that no legitimate input reaches it.
            max_bytes: 128 << 20,
        }
    }
}

/// What to do with a scalar that kubectl (YAML 1.1) and a YAML 1.2 reader read differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Yaml11 {
    /// Read it as kubectl does and record a [`YamlWarning`].
    Read,
    /// Refuse it with [`Error::AmbiguousYaml`] (`windvane build --strict`).
    Refuse,
}

/// A scalar read as kubectl reads it, where a YAML 1.2 reader would read something else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct YamlWarning {
    pub file: String,
    /// 1-based line and column of the scalar.
    pub line: usize,
    pub column: usize,
    /// The scalar as written.
    pub value: String,
    /// The two readings.
    pub detail: String,
    /// What to write to make the reading unambiguous.
    pub suggestion: String,
}

impl YamlWarning {
    /// The same, as the error `--strict` makes of it.
    pub fn into_error(self) -> Error {
        Error::AmbiguousYaml {
            file: self.file,
            line: self.line,
            column: self.column,
            value: self.value,
            detail: self.detail,
            suggestion: self.suggestion,
        }
    }
}

impl std::fmt::Display for YamlWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}:{}: {:?} read as kubectl reads it: {}; write {} to say so",
            self.file, self.line, self.column, self.value, self.detail, self.suggestion
        )
    }
}

/// The documents of a stream and the warnings about how they were read.
#[derive(Debug, Default, PartialEq)]
pub struct YamlDocuments {
    /// Every non-empty document with its index in the stream (see [`documents_to_json`]).
    pub documents: Vec<(usize, Value)>,
    pub warnings: Vec<YamlWarning>,
}

/// Reads every non-empty document of a (multi-document) YAML stream as JSON, each with its index in the
/// stream, refusing what kubectl and a YAML 1.2 reader read differently ([`Yaml11::Refuse`]): for the
/// configuration files Windvane reads itself. Indexes count from 0 and include the empty documents that are
/// skipped, so that they match what the user sees when counting `---` separators. A document that is only
/// `null` counts as empty. `file` names the source in errors.
pub fn documents_to_json(
    text: &str,
    file: &str,
    limits: YamlLimits,
) -> Result<Vec<(usize, Value)>> {
    read_documents(text, file, limits, Yaml11::Refuse).map(|read| read.documents)
}

/// [`documents_to_json`], with YAML 1.1 forms read as kubectl reads them when `yaml11` says so.
pub fn read_documents(
    text: &str,
    file: &str,
    limits: YamlLimits,
    yaml11: Yaml11,
) -> Result<YamlDocuments> {
    // yaml-rust2 does not skip a byte-order mark; editors on some platforms write one.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut builder = Builder::new(file, limits, yaml11);
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
    Ok(YamlDocuments {
        documents: builder.documents,
        warnings: builder.warnings,
    })
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
    yaml11: Yaml11,
    /// Nodes and bytes produced so far in this stream, alias expansions included.
    nodes: usize,
    bytes: usize,
    stack: Vec<Frame>,
    /// Completed anchored nodes of the current document, with how many nodes and bytes each expands to.
    anchors: HashMap<usize, Anchored>,
    root: Option<Value>,
    document_index: usize,
    documents: Vec<(usize, Value)>,
    warnings: Vec<YamlWarning>,
}

struct Anchored {
    value: Value,
    nodes: usize,
    bytes: usize,
}

struct Frame {
    anchor: usize,
    /// `Builder::nodes` and `bytes` when this collection started, to know what an alias to it expands to.
    nodes_before: usize,
    bytes_before: usize,
    kind: FrameKind,
}

enum FrameKind {
    Sequence(Vec<Value>),
    Mapping {
        map: Map<String, Value>,
        /// The key read and waiting for its value; `None` when the next node is a key.
        pending_key: Option<Key>,
        /// Line of each key, to name both places when a key repeats.
        key_lines: HashMap<String, usize>,
    },
}

/// A mapping key waiting for its value.
enum Key {
    Name(String),
    /// A plain `<<`: the value is merged in.
    Merge,
}

impl<'a> Builder<'a> {
    fn new(file: &'a str, limits: YamlLimits, yaml11: Yaml11) -> Self {
        Self {
            file,
            limits,
            yaml11,
            nodes: 0,
            bytes: 0,
            stack: Vec::new(),
            anchors: HashMap::new(),
            root: None,
            document_index: 0,
            documents: Vec::new(),
            warnings: Vec::new(),
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

    fn count(&mut self, nodes: usize, bytes: usize, mark: &Marker) -> Result<()> {
        self.nodes = self.nodes.saturating_add(nodes);
        self.bytes = self.bytes.saturating_add(bytes);
        if self.nodes > self.limits.max_nodes {
            return Err(self.parse_error(
                mark,
                format!(
                    "more than {} nodes (aliases expanding to too much data?); the cap protects every reader",
                    self.limits.max_nodes
                ),
            ));
        }
        if self.bytes > self.limits.max_bytes {
            return Err(self.parse_error(
                mark,
                format!(
                    "more than {} MiB of values (aliases expanding to too much data?); the cap protects every \
                     reader",
                    self.limits.max_bytes >> 20
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
        self.count(1, NODE_BYTES, mark)?;
        self.stack.push(Frame {
            anchor,
            nodes_before: self.nodes - 1,
            bytes_before: self.bytes - NODE_BYTES,
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
            let anchored = Anchored {
                value: value.clone(),
                nodes: self.nodes - frame.nodes_before,
                bytes: self.bytes - frame.bytes_before,
            };
            self.anchors.insert(frame.anchor, anchored);
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
        let bytes = text.len().saturating_add(NODE_BYTES);
        self.count(1, bytes, &mark)?;
        if is_key && text == "<<" && style == TScalarStyle::Plain && tag.is_none() {
            self.differs(
                &mark,
                text,
                "a merge key: kubectl and Helm merge the mapping it is given into this one; YAML 1.2 has \
                 no merge keys and reads the key \"<<\""
                    .to_owned(),
                "the merged fields out in full instead of <<".to_owned(),
            )?;
            return self.set_pending(Key::Merge, &mark);
        }
        if is_key && anchor == 0 && style == TScalarStyle::Plain && tag.is_none() {
            let key = self.plain_key(text, &mark)?;
            return self.set_key_name(key, &mark);
        }
        let value = self.resolve_scalar(text, style, tag, &mark)?;
        if anchor > 0 {
            let anchored = Anchored {
                value: value.clone(),
                nodes: 1,
                bytes,
            };
            self.anchors.insert(anchor, anchored);
        }
        if is_key {
            self.set_key(value, &mark)
        } else {
            self.attach(value, &mark)
        }
    }

    fn on_alias(&mut self, id: usize, mark: Marker) -> Result<()> {
        let Some((nodes, bytes)) = self.anchors.get(&id).map(|a| (a.nodes, a.bytes)) else {
            // The parser has already resolved the name, so the anchor exists but is not complete yet.
            return Err(self.parse_error(
                &mark,
                "an alias refers to a node that contains it (a recursive alias)",
            ));
        };
        // Count before cloning, so that an expansion over the caps is never materialised.
        self.count(nodes, bytes, &mark)?;
        let value = self
            .anchors
            .get(&id)
            .map_or(Value::Null, |anchored| anchored.value.clone());
        if self.expecting_key() {
            self.set_key(value, &mark)
        } else {
            self.attach(value, &mark)
        }
    }

    /// Records a mapping key (a resolved scalar, quoted, tagged or from an alias) after turning it into a string
    /// as `sigs.k8s.io/yaml` does.
    fn set_key(&mut self, key: Value, mark: &Marker) -> Result<()> {
        let key = key_string(&key).map_err(|bad| self.parse_error(mark, bad))?;
        self.set_key_name(key, mark)
    }

    /// Records a mapping key after checking it is new.
    fn set_key_name(&mut self, key: String, mark: &Marker) -> Result<()> {
        let line = mark.line();
        let first = match self.stack.last_mut() {
            Some(Frame {
                kind: FrameKind::Mapping { key_lines, .. },
                ..
            }) => key_lines.insert(key.clone(), line),
            _ => return Err(self.parse_error(mark, "a key outside a mapping")),
        };
        match first {
            Some(first) => Err(self.parse_error(
                mark,
                format!("duplicate key {key:?} (first on line {first}); a mapping may give a key only once"),
            )),
            None => self.set_pending(Key::Name(key), mark),
        }
    }

    fn set_pending(&mut self, key: Key, mark: &Marker) -> Result<()> {
        match self.stack.last_mut() {
            Some(Frame {
                kind: FrameKind::Mapping { pending_key, .. },
                ..
            }) => {
                *pending_key = Some(key);
                Ok(())
            }
            _ => Err(self.parse_error(mark, "a key outside a mapping")),
        }
    }

    fn attach(&mut self, value: Value, mark: &Marker) -> Result<()> {
        let pending = match self.stack.last_mut() {
            None => {
                self.root = Some(value);
                return Ok(());
            }
            Some(Frame {
                kind: FrameKind::Sequence(items),
                ..
            }) => {
                items.push(value);
                return Ok(());
            }
            Some(Frame {
                kind:
                    FrameKind::Mapping {
                        map, pending_key, ..
                    },
                ..
            }) => match pending_key.take() {
                Some(Key::Name(key)) => {
                    map.insert(key, value);
                    return Ok(());
                }
                Some(Key::Merge) => merge(map, value),
                None => Err("a mapping value without a key"),
            },
        };
        pending.map_err(|detail| self.parse_error(mark, detail))
    }

    /// A scalar read differently by kubectl and a YAML 1.2 reader: a warning, or with `--strict` an error.
    fn differs(
        &mut self,
        mark: &Marker,
        value: &str,
        detail: String,
        suggestion: String,
    ) -> Result<()> {
        let warning = YamlWarning {
            file: self.file.to_owned(),
            line: mark.line(),
            column: mark.col() + 1,
            value: value.to_owned(),
            detail,
            suggestion,
        };
        match self.yaml11 {
            Yaml11::Refuse => Err(warning.into_error()),
            Yaml11::Read => {
                self.warnings.push(warning);
                Ok(())
            }
        }
    }

    fn resolve_scalar(
        &mut self,
        text: &str,
        style: TScalarStyle,
        tag: Option<&Tag>,
        mark: &Marker,
    ) -> Result<Value> {
        let Some(tag) = tag else {
            if style != TScalarStyle::Plain {
                return Ok(Value::String(text.to_owned()));
            }
            return self.plain_value(text, mark);
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
        // go-yaml resolves a tagged scalar as an untagged one, then checks the tag (`!!int 0644` is 420), and
        // makes a signed integer a float for `!!float`.
        let mut value = self.plain_value(text, mark)?;
        if kind == "float"
            && let Some(int) = value.as_i64()
        {
            // Go's float64(int), rounding as it does.
            #[allow(clippy::cast_precision_loss)]
            let float = int as f64;
            value = float_value(float);
        }
        let fits = match kind {
            "null" => value.is_null(),
            "bool" => value.is_boolean(),
            // Go checks the resolved tag: `!!int 1e3` is a float, refused, though JSON writes it 1000.
            "int" => is_int11(text),
            // A signed integer became a float above; Go refuses an unsigned one.
            _ => value.is_f64() || value.is_i64(),
        };
        if fits {
            Ok(value)
        } else {
            Err(self.parse_error(
                mark,
                format!("{text:?} is not a valid !!{kind} as kubectl reads it"),
            ))
        }
    }

    /// A plain scalar as kubectl reads it, with a warning (or, strict, an error) where YAML 1.2 differs.
    fn plain_value(&mut self, text: &str, mark: &Marker) -> Result<Value> {
        let kubectl = match resolve11(text) {
            Resolution::Value(value) => value,
            Resolution::Float(f) if f.is_finite() => float_value(f),
            Resolution::Float(_) => {
                return Err(self.parse_error(
                    mark,
                    format!(
                        "{text} (infinity or not-a-number) cannot be represented in JSON; quote it for a string"
                    ),
                ));
            }
        };
        let core = core_value(text);
        if core.as_ref() != Some(&kubectl) {
            let yaml12 = core.map_or_else(|| "no JSON value".to_owned(), |v| v.to_string());
            let suggestion = match &kubectl {
                Value::String(_) => format!("{text:?} (quoted)"),
                other => format!("{other}, or {text:?} (quoted) for the string"),
            };
            self.differs(
                mark,
                text,
                format!("kubectl and Helm (YAML 1.1) read {kubectl}, a YAML 1.2 reader {yaml12}"),
                suggestion,
            )?;
        }
        Ok(kubectl)
    }

    /// A plain key as kubectl reads it (`on` is `"true"`, `0644` is `"420"`, `1e6` is `"1e+06"`), with a
    /// warning (or, strict, an error) where a YAML 1.2 reader reads another key.
    fn plain_key(&mut self, text: &str, mark: &Marker) -> Result<String> {
        let kubectl = match resolve11(text) {
            Resolution::Value(value) => {
                key_string(&value).map_err(|bad| self.parse_error(mark, bad))?
            }
            Resolution::Float(f) => float_key(f),
        };
        let yaml12 = core_value(text).and_then(|value| key_string(&value).ok());
        if yaml12.as_deref() != Some(kubectl.as_str()) {
            let yaml12 =
                yaml12.map_or_else(|| "no key".to_owned(), |key| format!("the key {key:?}"));
            self.differs(
                mark,
                text,
                format!("kubectl and Helm (YAML 1.1) read the key {kubectl:?}, a YAML 1.2 reader {yaml12}"),
                format!("{text:?} (quoted) for the key"),
            )?;
        }
        Ok(kubectl)
    }
}

/// A mapping key `sigs.k8s.io/yaml` refuses, and why.
#[derive(Debug)]
enum BadKey {
    /// A number beyond a signed 64-bit integer.
    TooLarge(Number),
    Null,
    /// A sequence or a mapping.
    Collection,
}

impl std::fmt::Display for BadKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BadKey::TooLarge(n) => write!(
                f,
                "the mapping key {n} does not fit a signed 64-bit integer; quote it"
            ),
            BadKey::Null => f.write_str("a mapping key is null; quote it if it is meant as text"),
            BadKey::Collection => {
                f.write_str("a mapping key must be a scalar, not a sequence or mapping")
            }
        }
    }
}

/// A mapping key as `sigs.k8s.io/yaml` writes it; an error for the keys it refuses.
fn key_string(key: &Value) -> std::result::Result<String, BadKey> {
    match key {
        Value::String(s) => Ok(s.clone()),
        Value::Bool(b) => Ok(b.to_string()),
        Value::Number(n) if n.is_i64() => Ok(n.to_string()),
        Value::Number(n) if n.is_f64() => Ok(float_key(n.as_f64().unwrap_or_default())),
        Value::Number(n) => Err(BadKey::TooLarge(n.clone())),
        Value::Null => Err(BadKey::Null),
        Value::Array(_) | Value::Object(_) => Err(BadKey::Collection),
    }
}

/// Merges a `<<` key's value into `map` as go-yaml v2 does: a mapping's keys replace the ones already there;
/// a list of mappings is merged from its last item to its first, so that earlier ones take precedence.
fn merge(map: &mut Map<String, Value>, value: Value) -> std::result::Result<(), &'static str> {
    const WANT: &str = "a << merge key must be given a mapping or a list of mappings";
    match value {
        Value::Object(merged) => {
            map.extend(merged);
            Ok(())
        }
        Value::Array(items) => {
            if !items.iter().all(Value::is_object) {
                return Err(WANT);
            }
            for item in items.into_iter().rev() {
                if let Value::Object(merged) = item {
                    map.extend(merged);
                }
            }
            Ok(())
        }
        _ => Err(WANT),
    }
}

/// A float mapping key as `sigs.k8s.io/yaml` writes it: Go's `%g` at single precision, shortest digits, in
/// exponent form below 1e-4 and from 1e6 on (`1e+06`), infinities and not-a-number in YAML's words.
fn float_key(f: f64) -> String {
    // Go converts to single precision here.
    #[allow(clippy::cast_possible_truncation)]
    let single = f as f32;
    if single.is_nan() {
        return ".nan".to_owned();
    }
    if single.is_infinite() {
        return if single > 0.0 { ".inf" } else { "-.inf" }.to_owned();
    }
    let scientific = format!("{single:e}");
    let (mantissa, exponent) = scientific
        .split_once('e')
        .unwrap_or((scientific.as_str(), "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if single == 0.0 || (-4..6).contains(&exponent) {
        return single.to_string();
    }
    let sign = if exponent < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exponent.unsigned_abs())
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

/// How go-yaml v2 resolves a plain scalar, as `sigs.k8s.io/yaml` turns it into JSON.
#[derive(Debug, PartialEq)]
enum Resolution {
    Value(Value),
    /// A float, kept as such for keys (`1.0:` is the key `"1"`, `1e6:` is `"1e+06"`). `.inf` and `.nan` are
    /// floats too, which JSON cannot hold as values (Go's JSON encoder refuses them).
    Float(f64),
}

/// go-yaml v2's `resolve` for an untagged plain scalar (resolve.go), step by step: the table of fixed words,
/// then by the first character a float (`.`), or an integer or float (a digit or sign), else a string.
/// Timestamps become strings when read into JSON, so they need no step of their own.
fn resolve11(text: &str) -> Resolution {
    let fixed = match text {
        "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => {
            Some(Value::Bool(true))
        }
        "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
            Some(Value::Bool(false))
        }
        "" | "~" | "null" | "Null" | "NULL" => Some(Value::Null),
        ".nan" | ".NaN" | ".NAN" => return Resolution::Float(f64::NAN),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            return Resolution::Float(f64::INFINITY);
        }
        "-.inf" | "-.Inf" | "-.INF" => return Resolution::Float(f64::NEG_INFINITY),
        _ => None,
    };
    if let Some(value) = fixed {
        return Resolution::Value(value);
    }
    let string = || Resolution::Value(Value::String(text.to_owned()));
    match text.as_bytes()[0] {
        b'.' => go_float(text).map_or_else(string, Resolution::Float),
        b'+' | b'-' | b'0'..=b'9' => {
            let plain = text.replace('_', "");
            if let Some(int) = go_int(&plain) {
                return Resolution::Value(int);
            }
            if let Some(f) = go_float(&plain) {
                return Resolution::Float(f);
            }
            binary_after_prefix(&plain).map_or_else(string, Resolution::Value)
        }
        _ => string(),
    }
}

/// Whether go-yaml v2 resolves a plain scalar to `!!int`.
fn is_int11(text: &str) -> bool {
    if !text.starts_with(|c: char| c.is_ascii_digit() || c == '+' || c == '-') {
        return false;
    }
    let plain = text.replace('_', "");
    go_int(&plain).is_some()
        || (go_float(&plain).is_none() && binary_after_prefix(&plain).is_some())
}

/// Go's `strconv.ParseInt(text, 0, 64)`, then `ParseUint(text, 0, 64)`: an optional sign, then `0b`, `0o`,
/// `0x` (either case) or a leading `0` (octal), else decimal.
fn go_int(text: &str) -> Option<Value> {
    let (negative, unsigned) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let signed = unsigned.len() != text.len();
    let (radix, digits) = go_radix(unsigned)?;
    let magnitude = go_digits(digits, radix)?;
    if negative {
        return 0i64.checked_sub_unsigned(magnitude).map(Value::from);
    }
    if let Ok(small) = i64::try_from(magnitude) {
        return Some(Value::from(small));
    }
    // ParseUint takes no sign.
    (!signed).then(|| Value::from(magnitude))
}

/// The radix and digits of an unsigned Go integer literal (base 0).
fn go_radix(text: &str) -> Option<(u32, &str)> {
    if !text.starts_with('0') {
        return Some((10, text));
    }
    if text.len() >= 3 {
        match text.as_bytes()[1].to_ascii_lowercase() {
            b'b' => return Some((2, &text[2..])),
            b'o' => return Some((8, &text[2..])),
            b'x' => return Some((16, &text[2..])),
            _ => {}
        }
    }
    Some((8, &text[1..]))
}

/// The value of `digits` in `radix` (empty is 0, as Go reads `0` as octal nothing), when it fits in 64 bits.
fn go_digits(digits: &str, radix: u32) -> Option<u64> {
    let mut value = 0u64;
    for c in digits.chars() {
        let digit = c.to_digit(radix)?;
        value = value
            .checked_mul(u64::from(radix))?
            .checked_add(u64::from(digit))?;
    }
    Some(value)
}

/// Go's `strconv.ParseFloat` on what go-yaml passes it: text of the form
/// `[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?` (what Go parses of text starting with `.` has that
/// form too). Out of range is no float (a string, in Go).
fn go_float(text: &str) -> Option<f64> {
    if !is_core_float(split_sign(text).1) {
        return None;
    }
    let f: f64 = text.parse().ok()?;
    f.is_finite().then_some(f)
}

/// go-yaml's last try for a string starting `0b` that Go's base-0 parse refused: the rest in base 2, where Go
/// accepts a sign (`0b-101` is -5).
fn binary_after_prefix(text: &str) -> Option<Value> {
    let rest = text.strip_prefix("0b")?;
    let (negative, digits) = match rest.as_bytes().first()? {
        b'-' => (true, &rest[1..]),
        b'+' => (false, &rest[1..]),
        _ => (false, rest),
    };
    if digits.is_empty() {
        return None;
    }
    let magnitude = go_digits(digits, 2)?;
    if negative {
        0i64.checked_sub_unsigned(magnitude).map(Value::from)
    } else {
        Some(Value::from(magnitude))
    }
}

/// How a YAML 1.2 core-schema reader reads a plain scalar as JSON; `None` when it has no JSON value (too large
/// an integer, infinity).
fn core_value(text: &str) -> Option<Value> {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Some(Value::Null),
        "true" | "True" | "TRUE" => return Some(Value::Bool(true)),
        "false" | "False" | "FALSE" => return Some(Value::Bool(false)),
        ".nan" | ".NaN" | ".NAN" => return None,
        _ => {}
    }
    for (prefix, radix) in [("0o", 8), ("0x", 16)] {
        if let Some(digits) = text.strip_prefix(prefix)
            && is_digits(digits, radix)
        {
            return u64::from_str_radix(digits, radix).ok().map(Value::from);
        }
    }
    let (negative, unsigned) = split_sign(text);
    if is_digits(unsigned, 10) {
        let magnitude = unsigned.parse::<u64>().ok()?;
        return if negative {
            0i64.checked_sub_unsigned(magnitude).map(Value::from)
        } else {
            Some(Value::from(magnitude))
        };
    }
    if matches!(unsigned, ".inf" | ".Inf" | ".INF") {
        return None;
    }
    if is_core_float(unsigned) {
        let f: f64 = text.parse().ok()?;
        return f.is_finite().then(|| float_value(f));
    }
    Some(Value::String(text.to_owned()))
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

    /// How kubectl reads `v: SCALAR`, with the warnings the reader records.
    fn read11(text: &str) -> (Value, Vec<YamlWarning>) {
        let read = read_documents(text, "t.yaml", YamlLimits::default(), Yaml11::Read).unwrap();
        let value = read
            .documents
            .into_iter()
            .next()
            .map_or(Value::Null, |(_, v)| v);
        (value, read.warnings)
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
            "1.2.3",
            "0xZZ",
            "1e",
            "e5",
            "--1",
            "12a",
            "0.5.1",
            "v1",
            "1:30",
            "2001-12-14",
            "yEs",
        ] {
            assert_eq!(value_of(s), json!(s), "{s}");
        }
    }

    #[test]
    fn numbers_json_cannot_hold_are_refused() {
        for bad in [".inf", "-.Inf", "+.INF", ".nan", ".NaN"] {
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
    fn yaml11_forms_are_read_as_kubectl_reads_them_with_a_warning() {
        let (value, warnings) = read11(
            "mode: 0644\nflag: yes\nother: Off\ncount: 1_000\nbits: 0b101\nhex: 0X1f\nplain: 08\n\
             time: 1:30\nsigned: -012\n",
        );
        assert_eq!(
            value,
            json!({"mode": 420, "flag": true, "other": false, "count": 1000, "bits": 5, "hex": 31,
                   "plain": 8, "time": "1:30", "signed": -10})
        );
        let lines: Vec<(usize, &str)> = warnings
            .iter()
            .map(|w| (w.line, w.value.as_str()))
            .collect();
        // `08` is 8 to both readers and `1:30` a string to both: no warning for them.
        assert_eq!(
            lines,
            [
                (1, "0644"),
                (2, "yes"),
                (3, "Off"),
                (4, "1_000"),
                (5, "0b101"),
                (6, "0X1f"),
                (9, "-012")
            ]
        );
        let message = warnings[0].to_string();
        assert!(
            message.starts_with(
                "t.yaml:1:7: \"0644\" read as kubectl reads it: kubectl and Helm (YAML 1.1) \
                                 read 420, a YAML 1.2 reader 644"
            ),
            "{message}"
        );
        assert_eq!(
            warnings[0].suggestion,
            "420, or \"0644\" (quoted) for the string"
        );
        // Keys too: `on:` is the key "true" to kubectl.
        let (value, warnings) = read11("on: push\n0644: a\nNo: b\n");
        assert_eq!(value, json!({"true": "push", "420": "a", "false": "b"}));
        assert_eq!(warnings.len(), 3, "{warnings:?}");
        assert!(
            warnings[0].detail.contains("the key \"true\""),
            "{:?}",
            warnings[0]
        );
    }

    #[test]
    fn strict_refuses_what_the_two_readings_differ_on() {
        for (text, line, column, value) in [
            ("a: 1\nflag: yes\n", 2, 7, "yes"),
            ("spec:\n  mode: 0644\n", 2, 9, "0644"),
            ("jobs:\n  on: push\n", 2, 3, "on"),
            ("v: !!int 0644\n", 1, 10, "0644"),
            ("v: 1_000\n", 1, 4, "1_000"),
            ("base: &b {a: 1}\nx:\n  <<: *b\n  c: 2\n", 3, 3, "<<"),
        ] {
            match err(text) {
                Error::AmbiguousYaml {
                    file,
                    line: l,
                    column: c,
                    value: v,
                    ..
                } => assert_eq!(
                    (file.as_str(), l, c, v.as_str()),
                    ("t.yaml", line, column, value),
                    "{text}"
                ),
                other => panic!("{text}: expected AmbiguousYaml, got {other}"),
            }
        }
        let message = err("mode: 0644\n").to_string();
        assert!(
            message.starts_with("t.yaml:1:7: \"0644\" reads differently"),
            "{message}"
        );
        // What both read the same passes strict reading.
        assert_eq!(value_of("\"0644\""), json!("0644"));
        assert_eq!(value_of("0o644"), json!(420));
        assert_eq!(value_of("1:30"), json!("1:30"));
        assert_eq!(value_of("<<"), json!("<<"));
    }

    #[test]
    fn merge_keys_merge_as_go_yaml_v2_merges() {
        let (value, warnings) = read11(
            "base: &b {a: 1, c: 2}\nx:\n  <<: *b\n  c: 3\nw:\n  a: 0\n  <<: *b\nz:\n  <<: [{a: 1}, {a: 2, b: 2}]\n",
        );
        assert_eq!(
            value,
            json!({"base": {"a": 1, "c": 2}, "x": {"a": 1, "c": 3}, "w": {"a": 1, "c": 2},
                   "z": {"a": 1, "b": 2}})
        );
        assert_eq!(
            warnings.iter().map(|w| w.line).collect::<Vec<_>>(),
            [3, 7, 9]
        );
        // A quoted "<<" is an ordinary key; a merge of anything but mappings is an error.
        assert_eq!(
            read11("x:\n  '<<': {a: 1}\n").0,
            json!({"x": {"<<": {"a": 1}}})
        );
        for bad in ["x:\n  <<: 1\n", "x:\n  <<: [{a: 1}, 2]\n"] {
            let error =
                read_documents(bad, "t.yaml", YamlLimits::default(), Yaml11::Read).unwrap_err();
            assert!(
                error
                    .to_string()
                    .contains("merge key must be given a mapping"),
                "{error}"
            );
        }
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
            ..YamlLimits::default()
        };
        assert!(documents_to_json("a: &x [1, 2, 3]\nb: *x\nc: *x\n", "t", small).is_err());
    }

    /// Issue 42 item 15: a large anchor aliased many times is few nodes but much memory; the byte cap stops
    /// it before the copies are made.
    #[test]
    fn aliases_are_capped_by_bytes_not_only_nodes() {
        let anchor = "x".repeat(1 << 20);
        let mut text = format!("a: &big {anchor}\nl:\n");
        for _ in 0..250 {
            text.push_str("  - *big\n");
        }
        // 251 MiB of values in 253 nodes: far under the node cap, over the byte cap.
        let Error::Parse { detail, .. } = err(&text) else {
            panic!()
        };
        assert!(detail.contains("more than 128 MiB of values"), "{detail}");
        let tight = YamlLimits {
            max_bytes: 3 << 20,
            ..YamlLimits::default()
        };
        let two = format!("a: &big {anchor}\nb: *big\n");
        assert!(documents_to_json(&two, "t", tight).is_ok());
        let three = format!("{two}c: *big\n");
        assert!(documents_to_json(&three, "t", tight).is_err());
        // Collections count by what they hold.
        let nested = format!("a: &m {{k: [{anchor}]}}\nb: *m\nc: *m\n");
        assert!(documents_to_json(&nested, "t", tight).is_err());
    }

    #[test]
    fn depth_is_capped() {
        let shallow = YamlLimits {
            max_nodes: 1_000,
            max_depth: 3,
            ..YamlLimits::default()
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
