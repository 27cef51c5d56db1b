//! Text from servers and clusters on its way to a terminal. A cluster's labels, names and errors and a
//! server's messages are not ours: an escape sequence in them could retitle the window, rewrite lines
//! already printed or hide a row. Every such text is printed through [`clean`] (or [`clean_line`] for one
//! table cell), which shows control characters and bidirectional overrides as `\u{…}` instead of sending them.
//! JSON and YAML output goes through [`clean_structured`], which writes them as the formats' own `\uXXXX`
//! escapes, so that what a program reads back is the server's value unchanged.

/// `text` with every control character except the newline, and every bidirectional control, written as
/// `\u{XX}` (visible, never interpreted).
pub fn clean(text: &str) -> String {
    escape(text, false)
}

/// [`clean`], with newlines escaped too: for one cell or line of output.
pub fn clean_line(text: &str) -> String {
    escape(text, true)
}

/// JSON or YAML text (as `serde_json` and `windvane_shared::text::yaml_out` write it) with every control character
/// but the newline, and every bidirectional control, written as `\uXXXX`. Those writers escape C0 controls
/// in strings themselves but send DEL, C1 controls (`\u{9b}` is a CSI on some terminals) and bidirectional
/// overrides as they are; outside strings they put only ASCII, spaces and newlines. So each such character
/// sits in a JSON string or a double-quoted YAML scalar, where `\uXXXX` is the same character to a reader.
/// (A YAML literal block holds no control character; a bidirectional override in one is shown as its
/// escape, visibly, rather than sent.)
pub fn clean_structured(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if is_unsafe(c, false) {
            // Every such character is in the Basic Multilingual Plane: four hex digits name it.
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

/// Whether `c` must not reach a terminal as it is.
fn is_unsafe(c: char, newlines: bool) -> bool {
    let bidi =
        matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    (c.is_control() && (c != '\n' || newlines)) || bidi
}

fn escape(text: &str, newlines: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if is_unsafe(c, newlines) {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_sequences_are_shown_not_sent() {
        assert_eq!(
            clean("eu\u{1b}]0;pwned\u{7}\u{1b}[2J\nnext"),
            "eu\\u{1b}]0;pwned\\u{7}\\u{1b}[2J\nnext"
        );
        assert_eq!(clean_line("a\nb\r\tc"), "a\\u{a}b\\u{d}\\u{9}c");
        assert_eq!(clean("\u{9b}31m \u{202e}txt"), "\\u{9b}31m \\u{202e}txt");
        assert_eq!(clean("prod-eu · Synced ✓"), "prod-eu · Synced ✓");
    }

    #[test]
    fn structured_output_keeps_its_values_and_sends_no_control() {
        let value =
            serde_json::json!({"name": "eu\u{9b}31m\u{202e}x\u{7f}", "error": "a\u{1b}[2J\tb"});
        let text = clean_structured(&serde_json::to_string_pretty(&value).expect("json"));
        assert!(
            !text.chars().any(|c| is_unsafe(c, false)),
            "nothing a terminal interprets: {text:?}"
        );
        let back: serde_json::Value = serde_json::from_str(&text).expect("still JSON");
        assert_eq!(back, value, "the same values");
        let yaml = clean_structured(&windvane_shared::text::yaml_out::to_yaml_string(&value));
        assert!(
            yaml.contains("name: \"eu\\u009b31m\\u202ex\\u007f\""),
            "{yaml}"
        );
    }
}
