//! Printing what a verb read, in the one place every verb prints through: `-o table` (aligned columns with
//! headers in capitals, as kubectl prints them, or a verb's own text), `-o json` (the server's or store's
//! objects, pretty-printed) and `-o yaml` (the same objects as block YAML). Everything goes through
//! `terminal.rs` on its way out: a table's cells are cleaned one line each, JSON and YAML keep their values
//! and escape what a terminal would interpret.

use std::io::Write;

use serde::Serialize;
use windvane_shared::text::yaml_out::to_yaml_string;

use crate::error::{Error, Result};
use crate::terminal::{clean, clean_line, clean_structured};

/// The output formats, the same for every verb that prints state (`--output`, `-o`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
    Yaml,
}

/// Spaces between two columns of a table (kubectl's).
const GAP: usize = 3;

/// `value` in `format`; `table` makes the text of `-o table` (cleaned here, newlines kept). `what` names the
/// value in an error.
pub fn render<T: Serialize>(
    format: Format,
    value: &T,
    what: &'static str,
    table: impl FnOnce() -> String,
) -> Result<String> {
    let json = || serde_json::to_value(value).map_err(|source| Error::PrintJson { what, source });
    Ok(match format {
        Format::Table => clean(&table()),
        Format::Json => {
            let text = serde_json::to_string_pretty(&json()?)
                .map_err(|source| Error::PrintJson { what, source })?;
            clean_structured(&text) + "\n"
        }
        Format::Yaml => clean_structured(&to_yaml_string(&json()?)),
    })
}

/// [`render`], written to standard output.
pub fn print<T: Serialize>(
    format: Format,
    value: &T,
    what: &'static str,
    table: impl FnOnce() -> String,
) -> Result<()> {
    let text = render(format, value, what, table)?;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|source| Error::Stdout { what, source })
}

/// A table: `header` (in capitals) and `rows`, each column as wide as its widest cell plus a gap, the last
/// column unpadded; every cell cleaned as one line.
pub fn table<const N: usize>(header: [&str; N], rows: &[[String; N]]) -> String {
    let rows: Vec<[String; N]> = rows
        .iter()
        .map(|row| row.clone().map(|cell| clean_line(&cell)))
        .collect();
    let mut widths = header.map(|h| h.chars().count());
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; N]| {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            text.push_str(cell);
            if i + 1 < N {
                let pad = widths[i] - cell.chars().count() + GAP;
                text.push_str(&" ".repeat(pad));
            }
        }
        text.trim_end().to_owned() + "\n"
    };
    let mut out = line(header);
    for row in &rows {
        out.push_str(&line(row.each_ref().map(String::as_str)));
    }
    out
}

/// Up to five of `items` joined with commas, then how many more there are (for one-line verdicts).
pub fn summarize(items: &[String]) -> String {
    match items.len() {
        n if n <= 5 => items.join(", "),
        n => format!("{}, and {} more", items[..5].join(", "), n - 5),
    }
}

/// Text for a time in the past, relative to now: `12s`, `5m`, `3h`, `2d` (kubectl's AGE column).
pub fn ago(seconds: u64) -> String {
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_aligns_its_columns_like_kubectl() {
        let rows = [
            ["prod-eu".to_owned(), "Synced".to_owned(), "4".to_owned()],
            ["s".to_owned(), "Degraded".to_owned(), "".to_owned()],
        ];
        assert_eq!(
            table(["NAME", "STATE", "SERIAL"], &rows),
            "NAME      STATE      SERIAL\nprod-eu   Synced     4\ns         Degraded\n"
        );
        assert_eq!(table(["NAME", "STATE"], &[]), "NAME   STATE\n");
    }

    #[test]
    fn a_cell_cannot_break_the_table_or_reach_the_terminal() {
        let rows = [["eu\n\u{1b}[2Jx".to_owned(), "ok".to_owned()]];
        let text = table(["NAME", "STATE"], &rows);
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(!text.contains('\u{1b}'), "{text}");
        assert!(text.contains("eu\\u{a}\\u{1b}[2Jx   ok"), "{text}");
    }

    #[test]
    fn every_format_prints_the_same_value() {
        let value = serde_json::json!({"name": "eu-1", "serial": 4});
        let table = || "NAME\neu-1\n".to_owned();
        assert_eq!(
            render(Format::Table, &value, "v", table).expect("table"),
            "NAME\neu-1\n"
        );
        let json = render(Format::Json, &value, "v", table).expect("json");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&json).expect("parse"),
            value
        );
        assert_eq!(
            render(Format::Yaml, &value, "v", table).expect("yaml"),
            "name: eu-1\nserial: 4\n"
        );
    }

    #[test]
    fn ages_read_as_kubectl_writes_them() {
        assert_eq!(ago(5), "5s");
        assert_eq!(ago(600), "10m");
        assert_eq!(ago(3 * 3600), "3h");
        assert_eq!(ago(3 * 86_400), "3d");
    }
}
