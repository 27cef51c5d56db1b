//! The publisher's modules keep their order (`windvane_publisher::LAYERS`: manifests, then prerender, then
//! source) without an import cycle; the check is the core's (`shared/tests/layering`). The publisher reads
//! files and runs engines, so only the layer order is checked, not the core's ban on I/O.

// The core's ban on I/O and clock reads (`IO_AND_CLOCK`) does not apply to the publisher.
#[allow(dead_code)]
#[path = "../../shared/tests/layering/mod.rs"]
mod layering;

use std::path::Path;

#[test]
fn the_publisher_keeps_its_layers() {
    let modules = layering::read_modules(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(
        modules.len() >= windvane_publisher::LAYERS.len(),
        "{modules:#?}"
    );
    let mut problems = layering::violations(&modules, windvane_publisher::LAYERS, &[], &[]);
    // No production function returns a bare `String` as its error: each failed step has a typed error.
    problems.extend(layering::string_errors(&modules));
    assert!(
        problems.is_empty(),
        "layering violations:\n{}",
        problems.join("\n")
    );
}
