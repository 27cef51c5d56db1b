//! Layer 1: text codecs with no knowledge of Windvane's types: durations (`30s`, `1h30m`), YAML read as kubectl
//! reads it (with YAML 1.1/1.2 ambiguity warnings) and YAML written for people.

pub mod duration;
pub mod yaml;
pub mod yaml_out;
