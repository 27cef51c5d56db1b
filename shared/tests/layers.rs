//! The core's layers hold: every module uses only lower layers or its own folder (the table is
//! `windvane_shared::LAYERS`), no import cycle, no I/O and no clock read in production code. A module added
//! outside the table, an upward import or a cycle fails this test, and so the build.

mod layering;

use std::path::Path;

use layering::{IO_AND_CLOCK, Module, crate_paths, read_modules, string_errors, violations};

const REEXPORTS: &[(&str, &str)] = &[("Error", "error"), ("Result", "error")];

#[test]
fn the_core_keeps_its_layers() {
    let modules = read_modules(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let problems = violations(&modules, windvane_shared::LAYERS, REEXPORTS, IO_AND_CLOCK);
    assert!(
        problems.is_empty(),
        "layering violations:\n{}",
        problems.join("\n")
    );
    // The table is not stale: every layer holds a module, and the wire types and the rollout spec are leaves
    // (they use nothing of the crate but the error type and the text codecs).
    for (layer, _) in windvane_shared::LAYERS {
        let holds = |m: &Module| m.folder.as_deref() == Some(*layer) || m.name == *layer;
        assert!(modules.iter().any(holds), "layer {layer} holds no module");
    }
    for module in modules
        .iter()
        .filter(|m| matches!(m.folder.as_deref(), Some("wire" | "spec")))
    {
        for (first, _) in &module.uses {
            let allowed = ["Error", "Result", "error", "text"].contains(&first.as_str())
                || module.folder.as_deref() == Some(first.as_str());
            assert!(
                allowed,
                "{}::{} is not a leaf: it uses crate::{first}",
                module.folder.as_deref().unwrap_or(""),
                module.name
            );
        }
    }
}

fn module(folder: Option<&str>, name: &str, text: &str) -> Module {
    Module {
        folder: folder.map(str::to_owned),
        name: name.to_owned(),
        uses: crate_paths(text),
        text: text.to_owned(),
    }
}

/// The checker itself can fail: the cycle the flat crate had (approval → release → bundle → rollout →
/// approval), an upward import, a module outside the table and a clock read are each reported.
#[test]
fn the_check_reports_cycles_upward_imports_unknown_modules_and_clock_reads() {
    let flat = [
        module(None, "approval", "use crate::release::ReleasePointer;"),
        module(
            None,
            "release",
            "use crate::{bundle::{Bundle, BundleLimits}, Error};",
        ),
        module(
            None,
            "bundle",
            "pub rollout: Option<crate::rollout::Rollout>,",
        ),
        module(
            None,
            "rollout",
            "pub approval: Option<crate::approval::ApprovalPolicy>,",
        ),
    ];
    let layers = [
        ("approval", 1),
        ("release", 1),
        ("bundle", 1),
        ("rollout", 1),
        ("error", 0),
    ];
    let problems = violations(&flat, &layers, REEXPORTS, IO_AND_CLOCK);
    assert!(
        problems.contains(
            &"import cycle: approval -> release -> bundle -> rollout -> approval".to_owned()
        ),
        "{problems:#?}"
    );

    let layered = [
        module(
            Some("wire"),
            "heartbeat",
            "use crate::decide::rollout::PendingReport;",
        ),
        module(
            Some("decide"),
            "rollout",
            "let now = jiff::Timestamp::now();",
        ),
        module(Some("wire"), "status", ""),
        module(Some("extra"), "thing", ""),
    ];
    let problems = violations(
        &layered,
        &[("wire", 2), ("decide", 5)],
        REEXPORTS,
        IO_AND_CLOCK,
    );
    let expected = [
        "wire::heartbeat (layer wire, rank 2) uses decide::rollout (layer decide, rank 5)",
        "decide::rollout uses Timestamp::now",
        "extra::thing is in no layer of the table",
    ];
    for expected in expected {
        assert!(
            problems.iter().any(|p| p.starts_with(expected)),
            "{expected}: {problems:#?}"
        );
    }
}

/// No production function of the core returns `Result<_, String>`: errors are `Error` variants naming the step
/// and the object.
#[test]
fn the_core_has_no_string_errors() {
    let modules = read_modules(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let found = string_errors(&modules);
    assert!(
        found.is_empty(),
        "Result<_, String> in production code:\n{}",
        found.join("\n")
    );
    let sample = [module(
        Some("spec"),
        "window",
        "fn f() -> std::result::Result<Vec<(u8, u8)>, String> {}",
    )];
    assert_eq!(
        string_errors(&sample),
        ["spec::window: Result<Vec<(u8, u8)>, String>"]
    );
    let fine = [module(
        Some("text"),
        "yaml",
        "fn f() -> Result<String> {} fn g() -> Result<(), ()> {}",
    )];
    assert!(string_errors(&fine).is_empty());
}
