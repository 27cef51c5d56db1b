//! The layering check shared by `shared/tests/layers.rs` and `publisher/tests/layers.rs` (and the string-error
//! check, also by `store/tests/no_string_errors.rs`): reads a crate's production sources, extracts the
//! `crate::…` paths each module uses, and reports every import against the declared layer order, every module
//! outside the table, every import cycle, every I/O or clock read, and every `Result<_, String>`.
//!
//! A module is a file under `src/`: `tests.rs` files and the inline `#[cfg(test)] mod tests { … }` at the end of
//! a file are tests and not checked, and `lib.rs`, which declares the layers, is in none of them. A module's
//! layer is its folder for a file in a folder, or its own name for a file at the root (so a folder's
//! `<folder>.rs`, which declares its modules, is in the folder's layer).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One production module: its folder (`None` at the root), its name, and the modules it uses, each as
/// `(folder or root module, module within the folder)`.
#[derive(Debug)]
pub struct Module {
    pub folder: Option<String>,
    pub name: String,
    pub uses: BTreeSet<(String, Option<String>)>,
    pub text: String,
}

/// What the pure core's production code must not use: it does no I/O and reads no clock (time is passed in).
pub const IO_AND_CLOCK: &[&str] = &[
    "std::fs",
    "std::net",
    "std::process",
    "std::env",
    "Timestamp::now",
    "SystemTime::now",
    "Instant::now",
    "tokio",
];

/// Reads every `.rs` file under `src` as a module.
pub fn read_modules(src: &Path) -> Vec<Module> {
    let mut files = Vec::new();
    collect(src, &mut files);
    files.sort();
    let mut modules = Vec::new();
    for file in files {
        let relative = file.strip_prefix(src).expect("under src");
        let parts: Vec<String> = relative
            .iter()
            .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_owned())
            .collect();
        let name = parts.last().expect("a file").clone();
        if name == "tests" {
            continue;
        }
        let text = production_text(&std::fs::read_to_string(&file).expect("readable source"));
        let folder = (parts.len() > 1).then(|| parts[0].clone());
        let uses = crate_paths(&text);
        modules.push(Module {
            folder,
            name,
            uses,
            text,
        });
    }
    modules
}

fn collect(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable src") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            collect(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

/// The file without its comments and without its inline test module (which by convention ends the file).
fn production_text(text: &str) -> String {
    let mut kept = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        if trimmed == "#[cfg(test)]"
            && lines
                .get(i + 1)
                .is_some_and(|next| next.trim() == "mod tests {")
        {
            break;
        }
        if trimmed.starts_with("//") {
            continue;
        }
        kept.push(*line);
    }
    kept.join("\n")
}

/// Every `crate::a::b` (and every path inside `crate::{…}`) as `(a, Some(b))`, or `(a, None)` for a single
/// segment such as `crate::Error`.
pub fn crate_paths(text: &str) -> BTreeSet<(String, Option<String>)> {
    let mut found = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = closing_brace(group);
            for item in split_top_level(&group[..end]) {
                found.insert(first_two(item));
            }
        } else {
            found.insert(first_two(rest));
        }
    }
    found
}

fn closing_brace(text: &str) -> usize {
    let mut depth = 0;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => return i,
            '}' => depth -= 1,
            _ => {}
        }
    }
    text.len()
}

fn split_top_level(text: &str) -> Vec<&str> {
    let (mut items, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(text[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(text[start..].trim());
    items.into_iter().filter(|i| !i.is_empty()).collect()
}

fn first_two(path: &str) -> (String, Option<String>) {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let first = ident(path);
    let after = &path[first.len()..];
    let second = after
        .strip_prefix("::")
        .map(ident)
        .filter(|s| !s.is_empty());
    (first, second)
}

/// Every violation of `layers` (folder or root module → rank) by `modules`; `reexports` are crate-root items
/// that stand for a module (`Error` for `error`); `forbidden` are paths no module may name.
pub fn violations(
    modules: &[Module],
    layers: &[(&str, u8)],
    reexports: &[(&str, &str)],
    forbidden: &[&str],
) -> Vec<String> {
    let rank: BTreeMap<&str, u8> = layers.iter().copied().collect();
    let mut problems = Vec::new();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    // The crate root declares the layers; it is in none of them.
    let layered = modules
        .iter()
        .filter(|m| !(m.folder.is_none() && m.name == "lib"));
    for module in layered {
        let layer = module.folder.clone().unwrap_or_else(|| module.name.clone());
        let id = key(&module.folder, &module.name);
        edges.entry(id.clone()).or_default();
        let own = rank.get(layer.as_str()).copied();
        if own.is_none() {
            problems.push(format!("{id} is in no layer of the table"));
        }
        for forbidden in forbidden {
            if module.text.contains(forbidden) {
                problems.push(format!(
                    "{id} uses {forbidden}: the layered code does no I/O and reads no clock"
                ));
            }
        }
        for (first, second) in &module.uses {
            let first = reexports
                .iter()
                .find(|(item, _)| item == first)
                .map_or(first.as_str(), |(_, module)| module);
            let target_is_folder = modules.iter().any(|m| m.folder.as_deref() == Some(first));
            let target = match (target_is_folder, second) {
                (true, Some(second)) => key(&Some(first.to_owned()), second),
                _ => first.to_owned(),
            };
            if target == id {
                continue;
            }
            edges.entry(id.clone()).or_default().insert(target.clone());
            let Some(own) = own else { continue };
            let Some(&theirs) = rank.get(first) else {
                problems.push(format!(
                    "{id} uses crate::{first}, which is in no layer of the table"
                ));
                continue;
            };
            let same_folder = module.folder.as_deref() == Some(first);
            if !same_folder && theirs >= own {
                problems.push(format!(
                    "{id} (layer {layer}, rank {own}) uses {target} (layer {first}, rank {theirs}): a module may \
                     only use lower layers or its own folder"
                ));
            }
        }
    }
    problems.extend(cycles(&edges));
    problems
}

fn key(folder: &Option<String>, name: &str) -> String {
    match folder {
        Some(folder) => format!("{folder}::{name}"),
        None => name.to_owned(),
    }
}

/// Each import cycle, once, as `a -> b -> … -> a` (depth-first search; a back edge closes a cycle).
pub fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    fn visit<'a>(
        node: &'a str,
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
        found: &mut BTreeSet<String>,
    ) {
        if let Some(at) = stack.iter().position(|n| *n == node) {
            let mut cycle: Vec<&str> = stack[at..].to_vec();
            // The same cycle found from another node reads the same: start it at its smallest module.
            let smallest = (0..cycle.len()).min_by_key(|&i| cycle[i]).unwrap_or(0);
            cycle.rotate_left(smallest);
            cycle.push(cycle[0]);
            found.insert(format!("import cycle: {}", cycle.join(" -> ")));
            return;
        }
        if done.contains(node) {
            return;
        }
        stack.push(node);
        for next in edges.get(node).into_iter().flatten() {
            visit(next, edges, stack, done, found);
        }
        stack.pop();
        done.insert(node);
    }
    let mut found = BTreeSet::new();
    let mut done = BTreeSet::new();
    for node in edges.keys() {
        visit(node, edges, &mut Vec::new(), &mut done, &mut found);
    }
    found.into_iter().collect()
}

/// Every production `Result<T, String>` (the standard: a typed error per failed step instead), as `module:
/// the type`.
pub fn string_errors(modules: &[Module]) -> Vec<String> {
    let mut found = Vec::new();
    for module in modules {
        let mut rest = module.text.as_str();
        while let Some(at) = rest.find("Result<") {
            rest = &rest[at + "Result<".len()..];
            let mut depth = 0;
            let end = rest
                .char_indices()
                .find(|&(_, c)| {
                    match c {
                        '<' | '(' => depth += 1,
                        '>' | ')' if depth == 0 => return true,
                        '>' | ')' => depth -= 1,
                        _ => {}
                    }
                    false
                })
                .map_or(rest.len(), |(i, _)| i);
            // Brackets as braces, so that the comma inside `Vec<(u8, u8)>` is not a top-level one.
            let bracketed = rest[..end]
                .replace(['<', '('], "{")
                .replace(['>', ')'], "}");
            let arguments = split_top_level(&bracketed);
            if arguments
                .get(1)
                .is_some_and(|error| error.trim() == "String")
            {
                let id = key(&module.folder, &module.name);
                found.push(format!("{id}: Result<{}>", &rest[..end]));
            }
        }
    }
    found
}
