//! Regression tests for crashes the fuzz targets (`fuzz/`, run by `tests/fuzz.sh`) found: each holds the
//! crashing input inline and checks the property the target asserts, so that the bug stays fixed without
//! running a fuzzer. How a crash becomes one of these: `fuzz/README.md`.

use serde_json::{Value, json};
use windvane_shared::spec::selector::LabelSelector;
use windvane_shared::text::yaml::{YamlLimits, documents_to_json, json_to_value};
use windvane_shared::text::yaml_out::to_yaml_string;

/// The `yaml` target's property: a value written by `yaml_out` reads back unchanged.
fn assert_yaml_round_trip(value: &Value) {
    let written = to_yaml_string(value);
    let read = documents_to_json(&written, "written.yaml", YamlLimits::default())
        .unwrap_or_else(|e| panic!("yaml_out wrote YAML its reader refuses: {e}\n{written}"));
    assert_eq!(
        read,
        vec![(0, value.clone())],
        "reads back differently:\n{written}"
    );
}

/// fuzz/artifacts/yaml/crash-62f2761a… (minimised): a mapping whose key, a plain scalar of 557 characters
/// with many control characters, becomes a double-quoted key of over 1024 characters once escaped. YAML
/// allows an implicit key of at most 1024 characters, so `yaml_out` wrote a document that no reader (its own,
/// go-yaml, kubectl) accepts. Long keys are now written as explicit keys (`? key` / `: value`).
#[test]
fn yaml_out_writes_keys_longer_than_1024_characters_readably() {
    const INPUT: &[&str] = &[
        "l\x01\x01l\x01{l\x01\x01ust\x01yfap\"\x023333333fip,\")\x01:m)\x01:Sy:\"C\x01yfigMap\",\"",
        "m:Sy\",\"C\x01\x01{il\x01mp\",\"ml\"C{:\"gMap\",\x01\x08):\"m:\"y\":\x01yfi\x01ap\",\x01",
        "v\"SC\x01\":\"C\x01\",\"m)::\"S\"C\x01yfigMp\"\"m)::\"C\x01yp\"\x01,m):\"m):\"S\":\"C\x01",
        "y33\x03\x03v'\x01yfiMap\"C\x01yigMap\"\x01{\x01:\"C\x01yfigMap\",\"\x01yfl\x15a\x01:yn\"",
        "\"C\x01y\x023333333\"m):\":\"C\x01yfgM3333\x03\":C\x01yf):)\"Syn:\"C\x01yfn\":\"C\x01y\"",
        "l\\Map\",\"\":\"C\x01yMp\",\"m)\"\x01m)::\"Syn\":\"C\x01figMap\"\x01\x01l\x01fSyn\":\"\x01",
        "yigMap\",:):,\"\x01\x01yfigM\"y\":\"C\x01yfigM,\":\":\"C\x01,m):\x01:\",\"m)\",\"m::\"u\x04",
        "n\":\x01yfM\x01\"m)::\x01\x01)\x01:yn\":\"\x01yfiap\",\":):\"\":\"C\x01\x01u\x01\x01Cp\"",
        ",\"m):p\",\"m)\x01)\"m):\x01gMa\",\"m\x01::\x01\x01)\"Syn\":\"\x01yfi\x023333333):\"m):\"",
        "S\":\"C\x01yfiga:p\",\"m):fiMap\",\"m):p\",\"m):fiMap\",\"m):p\",\"m):\"m):p\",\"m):",
    ];
    let text = INPUT.concat();
    let documents =
        documents_to_json(&text, "crash.yaml", YamlLimits::default()).expect("the input reads");
    assert_eq!(documents.len(), 1);
    let key_len = documents[0]
        .1
        .as_object()
        .and_then(|m| m.keys().next())
        .map(|k| k.chars().count());
    assert_eq!(key_len, Some(557));
    assert_yaml_round_trip(&documents[0].1);
}

/// The same bug as it reaches `windvane render`: a JSON manifest (which has no key length limit) with long
/// keys, plain-safe and quoted, at the top level, nested, and as the first key of a mapping in a list.
#[test]
fn long_keys_from_json_manifests_survive_yaml_out() {
    let long = "k".repeat(1100);
    let quoted = format!("{}\u{1}", "q".repeat(300)).repeat(3);
    let manifest = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "x"},
        "data": {long.clone(): "v", "short": "w"},
        long.clone(): {long.clone(): [1, {"a": 2}]},
        "items": [{long.clone(): "first", "b": {"c": null}}, {long.clone(): {"d": []}}, [{long.clone(): 1}]],
        quoted: {},
    });
    let text = serde_json::to_string(&manifest).expect("json");
    let value = json_to_value(&text, "long.json").expect("the manifest reads");
    assert_yaml_round_trip(&value);
}

/// fuzz/artifacts/yaml/crash-6fc90ac3…: a document that is the plain string `...` (after a comment, a
/// carriage return and tabs). `yaml_out` wrote it plain at the start of a line, where `...` is the
/// document end marker, so it read back as no document at all. Strings that would begin a line with `...`
/// or `---` are now quoted (or kept out of a literal block at column 0).
#[test]
fn yaml_out_never_starts_a_line_with_a_document_marker() {
    let text = "#.ae: *nfig\",\"npda\r\t\t\t\t\t\t\t\t...\n";
    let documents =
        documents_to_json(text, "crash.yaml", YamlLimits::default()).expect("the input reads");
    assert_eq!(documents, vec![(0, json!("..."))]);
    assert_yaml_round_trip(&documents[0].1);

    for value in [
        json!("... x"),
        json!({"... x": "v", "...": "w", "---": 1}),
        json!("a\n...\nb\n"),
        json!("a\n--- x\nb"),
        json!(["...", {"... y": "..."}]),
    ] {
        assert_yaml_round_trip(&value);
    }
}

/// fuzz/artifacts/http_request/crash-3075c630…: the fleet page's `selector` query parameter (percent-decoded
/// below) gives the key `FaileKKKKKKKokK5nor` two different values, the second one empty. The second equality
/// becomes an `In` requirement with the single value `""`, which `Display` wrote as `key in ()`, a form the
/// parser refuses: the page showed a selector that cannot be typed back. It is now written as `key=`, which
/// reads back as the same requirement.
#[test]
fn a_selector_with_a_conflicting_empty_equality_displays_as_it_parses() {
    let from_query = concat!(
        "envMKKKeKKKKKknown,FaileKKKKKKKokK5nor=envMKKKKKKknwi,aonFleKKKKKknowKEok25nor=envMKKKKKKk,",
        "ileKKKKKKKokK5nor77b6cd84cddwn,FaileKKKKknwi,aonFleKKKKKknown,FaileKKKKKKKokK5nor=envMsjsonKk,",
        "Fano5ccd730dbc08877DKKKeKKKKKknown,FaileKKKKKKKokK5nor=,Fa.o057ddc3cbc08877b6cd8nce=1h30m",
    );
    for text in [from_query, "env=a,env=", "env=,env=a", "env=a,env=,env=b"] {
        let selector = LabelSelector::parse(text).expect("the selector parses");
        let shown = selector.to_string();
        let again = LabelSelector::parse(&shown).unwrap_or_else(|e| {
            panic!("{text:?} is shown as {shown:?}, which does not parse: {e}")
        });
        assert_eq!(again, selector, "{text:?} is shown as {shown:?}");
    }
}
