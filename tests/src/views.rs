//! The fleet as the server's views show it, reduced to what can be compared: each cluster's state and the
//! count per state, read from the JSON API (`/api/v1/fleet`) or from the fleet page's HTML (`/`). Tests
//! assert that the views agree — with each other, across replicas, and with `windvane status`.

use std::collections::BTreeMap;

use serde_json::Value;

/// Cluster name → state, and state → count (states with none left out), as one view shows them.
#[derive(Debug, PartialEq, Eq)]
pub struct Shown {
    pub states: BTreeMap<String, String>,
    pub counts: BTreeMap<String, u64>,
}

/// Reads `/api/v1/fleet`'s `clusters` (name, state) and `counts`.
pub fn from_api(fleet: &Value) -> Shown {
    let states = fleet["clusters"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap_or("?").to_owned(),
                c["state"].as_str().unwrap_or("?").to_owned(),
            )
        })
        .collect();
    let counts = fleet["counts"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(_, n)| n.as_u64().unwrap_or(0) > 0)
                .map(|(s, n)| (s.clone(), n.as_u64().unwrap_or(0)))
                .collect()
        })
        .unwrap_or_default();
    Shown { states, counts }
}

/// Reads the fleet page's rows (`<tr class="s-STATE"><td><a href="/clusters/NAME">`) and its counters
/// (`id="count-STATE" …><div class="n">N</div>`).
pub fn from_page(html: &str) -> Shown {
    let mut states = BTreeMap::new();
    for row in html.split("<tr class=\"s-").skip(1) {
        let state = row.split('"').next().unwrap_or("?").to_owned();
        if let Some(name) = row
            .split("href=\"/clusters/")
            .nth(1)
            .and_then(|r| r.split('"').next())
        {
            states.insert(name.to_owned(), state);
        }
    }
    let mut counts = BTreeMap::new();
    for counter in html.split("id=\"count-").skip(1) {
        let state = counter.split('"').next().unwrap_or("?");
        let n = counter
            .split("<div class=\"n\">")
            .nth(1)
            .and_then(|r| r.split('<').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        if state != "total" && n > 0 {
            counts.insert(state.to_owned(), n);
        }
    }
    Shown { states, counts }
}
