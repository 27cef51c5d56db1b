//! The hand-written YAML reader (`yaml::documents_to_json`) and the strict JSON reader (`yaml::json_to_value`)
//! that every `fleet.yaml` and manifest goes through, and the YAML writer (`yaml_out`) that `windvane render`
//! and the agent's diffs print with.
//!
//! Mode 0: the bytes are a YAML stream, read both strictly and as kubectl reads it (YAML 1.1 forms, `<<`
//! merges, aliases capped by nodes and by bytes); mode 1: a `.json` manifest. Besides not panicking, every value read
//! must come back unchanged when written by `yaml_out` and read again: the writer promises that what it writes
//! plain reads back as the same string, and people copy `windvane render` output into fleet trees.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use windvane_fuzz::mode;
use windvane_shared::text::yaml::{Yaml11, YamlLimits, documents_to_json, json_to_value, read_documents};
use windvane_shared::text::yaml_out::to_yaml_string;

fuzz_target!(|data: &[u8]| {
    let Some((mode, data)) = mode(data, 2) else {
        return;
    };
    // The fleet loader refuses non-UTF-8 files before the readers see them.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if mode == 0
        && let Ok(read) = read_documents(text, "fuzz.yaml", YamlLimits::default(), Yaml11::Read)
    {
        // What the strict reading accepts, the kubectl reading reads the same, with no warning.
        if let Ok(strict) = documents_to_json(text, "fuzz.yaml", YamlLimits::default()) {
            assert_eq!(strict, read.documents, "the strict and the kubectl readings differ");
            assert!(read.warnings.is_empty(), "a warning where the strict reading saw none");
        }
    }
    let values: Vec<Value> = if mode == 0 {
        match documents_to_json(text, "fuzz.yaml", YamlLimits::default()) {
            Ok(documents) => {
                let mut last = None;
                for (index, value) in &documents {
                    assert!(
                        last.is_none_or(|l| l < *index),
                        "document indexes not increasing"
                    );
                    assert!(!value.is_null(), "a null document was returned");
                    last = Some(*index);
                }
                documents.into_iter().map(|(_, value)| value).collect()
            }
            Err(_) => return,
        }
    } else {
        match json_to_value(text, "fuzz.json") {
            Ok(value) => vec![value],
            Err(_) => return,
        }
    };
    for value in values {
        if value.is_null() {
            continue;
        }
        let written = to_yaml_string(&value);
        let read = documents_to_json(&written, "written.yaml", YamlLimits::default())
            .unwrap_or_else(|e| panic!("yaml_out wrote YAML its reader refuses: {e}\n{written}"));
        assert_eq!(
            read,
            vec![(0, value)],
            "yaml_out output reads back differently:\n{written}"
        );
    }
});
