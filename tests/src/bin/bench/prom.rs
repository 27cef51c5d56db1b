//! A small reader of the Prometheus text exposition format, enough for the apiserver's and the agent's
//! `/metrics`: samples with their labels and values. Comments, types and timestamps are skipped.

use std::collections::BTreeMap;

/// One sample: `name{labels} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample {
    /// The value of a label, or "" when the sample has none.
    pub fn label(&self, key: &str) -> &str {
        self.labels.get(key).map_or("", String::as_str)
    }
}

/// Every sample of an exposition. Lines that do not parse are skipped.
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines().filter_map(parse_line).collect()
}

/// The sum of the samples named `name` whose labels pass `keep`.
pub fn sum(samples: &[Sample], name: &str, keep: impl Fn(&Sample) -> bool) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name && keep(s))
        .map(|s| s.value)
        .sum()
}

fn parse_line(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = line[..name_end].to_owned();
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(inside) = rest.strip_prefix('{') {
        rest = parse_labels(inside, &mut labels)?;
    }
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// Reads `key="value",…}` into `labels`; returns what follows the closing brace.
fn parse_labels<'a>(mut text: &'a str, labels: &mut BTreeMap<String, String>) -> Option<&'a str> {
    loop {
        text = text.trim_start_matches([' ', ',']);
        if let Some(after) = text.strip_prefix('}') {
            return Some(after);
        }
        let (key, after_key) = text.split_once('=')?;
        let mut chars = after_key.strip_prefix('"')?.char_indices();
        let mut value = String::new();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                (_, c) => value.push(c),
            }
        };
        labels.insert(key.trim().to_owned(), value);
        text = &after_key[1 + end + 1..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_names_labels_and_values() {
        let text = "# HELP x\n# TYPE x counter\n\
            apiserver_request_total{code=\"200\",resource=\"leases\",verb=\"PUT\"} 4\n\
            odd{msg=\"a \\\"quoted\\\", comma\"} 1.5e3\n\
            plain 7\n\
            bucket{le=\"+Inf\"} 3 1700000000\n";
        let samples = parse(text);
        assert_eq!(samples.len(), 4);
        assert_eq!(samples[0].label("verb"), "PUT");
        assert_eq!(samples[0].value, 4.0);
        assert_eq!(samples[1].label("msg"), "a \"quoted\", comma");
        assert_eq!(samples[1].value, 1500.0);
        assert_eq!(samples[2].name, "plain");
        assert_eq!(samples[3].label("le"), "+Inf");
        assert_eq!(
            sum(&samples, "apiserver_request_total", |s| s.label("verb")
                == "PUT"),
            4.0
        );
    }
}
