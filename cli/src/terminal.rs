//! Text from servers and clusters on its way to a terminal. A cluster's labels, names and errors and a
//! server's messages are not ours: an escape sequence in them could retitle the window, rewrite lines
//! already printed or hide a row. Every such text is printed through [`clean`] (or [`clean_line`] for one
//! table cell), which shows control characters and bidirectional overrides as `\u{…}` instead of sending them.

/// `text` with every control character except the newline, and every bidirectional control, written as
/// `\u{XX}` (visible, never interpreted).
pub fn clean(text: &str) -> String {
    escape(text, false)
}

/// [`clean`], with newlines escaped too: for one cell or line of output.
pub fn clean_line(text: &str) -> String {
    escape(text, true)
}

fn escape(text: &str, newlines: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let bidi = matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        if (c.is_control() && (c != '\n' || newlines)) || bidi {
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
}
