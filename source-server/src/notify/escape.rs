//! Text from clusters (names, field managers, break-glass tickets, errors) escaped for each place the server
//! sends it, one function per sink, so that a cluster cannot write markup into what people read (the pages
//! escape through their templates, [`crate::fleet::page`]):
//!
//! - [`slack`]: Slack mrkdwn ([`crate::notify::body_for`]): `&`, `<` and `>` become entities, as Slack asks,
//!   so `<!channel>` cannot ping a channel and `<https://evil|Approve>` cannot draw a link.
//! - [`json`]: every JSON body the server sends out (webhooks, Slack's envelope, PagerDuty events, the audit
//!   export): standard JSON whose strings carry `<`, `>` and `&` as `\u003c`, `\u003e` and `\u0026`. The
//!   values decode unchanged (a receiver still reads the exact manager name), but a receiver that pastes the
//!   raw body into HTML or a chat message carries no markup along.
//! - [`one_line`]: titles (the Slack summary line, PagerDuty's `summary`), where a newline from a cluster
//!   would start a line of its own that looks like ours.
//!
//! Pure functions; they read nothing and log nothing.

use serde::Serialize;

/// Escapes text for Slack mrkdwn: the three characters Slack gives meaning to (`<…>` links, mentions and
/// commands; `&` starts an entity).
pub fn slack(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c => out.push(c),
        }
    }
    out
}

/// Text on one line: every control character (newlines, tabs, escape sequences) becomes a space.
pub fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// `value` as JSON with `<`, `>` and `&` in strings written as `\u003c`, `\u003e` and `\u0026`.
pub fn json(value: &impl Serialize) -> String {
    let mut out = Vec::with_capacity(256);
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, MarkupSafe);
    // Serializing a value already in memory into a Vec fails only for maps with non-string keys, which no
    // body has; an empty object is sent rather than nothing.
    if value.serialize(&mut serializer).is_err() {
        return "{}".to_owned();
    }
    String::from_utf8(out).unwrap_or_else(|_| "{}".to_owned())
}

/// serde_json's compact formatter, writing markup characters in strings as `\u` escapes.
struct MarkupSafe;

impl serde_json::ser::Formatter for MarkupSafe {
    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        let mut start = 0;
        for (at, byte) in fragment.bytes().enumerate() {
            let escaped: &[u8] = match byte {
                b'<' => b"\\u003c",
                b'>' => b"\\u003e",
                b'&' => b"\\u0026",
                _ => continue,
            };
            writer.write_all(&fragment.as_bytes()[start..at])?;
            writer.write_all(escaped)?;
            start = at + 1;
        }
        writer.write_all(&fragment.as_bytes()[start..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slack_mentions_and_links_become_text() {
        assert_eq!(
            slack("<!channel> <https://evil.example|Approve> & <@U123>"),
            "&lt;!channel&gt; &lt;https://evil.example|Approve&gt; &amp; &lt;@U123&gt;"
        );
        assert_eq!(slack("plain *bold* text"), "plain *bold* text");
        assert_eq!(
            slack("&lt;"),
            "&amp;lt;",
            "an entity in the input stays text"
        );
    }

    #[test]
    fn one_line_drops_line_breaks_and_escape_sequences() {
        assert_eq!(
            one_line("a\nb\r\tc\u{1b}[31m"),
            "a b  c [31m",
            "each control character is a space"
        );
    }

    #[test]
    fn json_writes_markup_as_unicode_escapes_and_decodes_unchanged() {
        let value = serde_json::json!({
            "who": "<!channel> & <https://evil|Approve>",
            "n": 3,
            "nested": ["<b>", "ünïcode \"quoted\"\n"],
        });
        let text = json(&value);
        assert!(
            !text.contains('<') && !text.contains('>') && !text.contains('&'),
            "{text}"
        );
        assert!(text.contains("\\u003c!channel\\u003e \\u0026"), "{text}");
        let back: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
        assert_eq!(back, value);
    }
}
