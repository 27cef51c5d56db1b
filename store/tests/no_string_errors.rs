//! No production function of the store returns `Result<_, String>`: its errors are `Error` variants naming the
//! step and the object (the check is the core's, `shared/tests/layering`).

#[allow(dead_code)]
#[path = "../../shared/tests/layering/mod.rs"]
mod layering;

use std::path::Path;

#[test]
fn the_store_has_no_string_errors() {
    let modules = layering::read_modules(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(modules.len() >= 5, "{modules:#?}");
    let found = layering::string_errors(&modules);
    assert!(
        found.is_empty(),
        "Result<_, String> in production code:\n{}",
        found.join("\n")
    );
}
