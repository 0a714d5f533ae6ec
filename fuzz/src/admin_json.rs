//! The admin API's JSON bodies: what `PUT` and `PATCH` of a route,
//! upstream or certificate do to the running document before it is
//! validated (`gatehouse_node::{named_entry, merge_patch}`,
//! `doc::from_json`), applied to the example config. Input: one byte of
//! choices (bits 0–1: the kind; bit 2: a patch of the first entry rather
//! than a new one), then the JSON body.
//!
//! Properties: no panic; a write that validates is stored as YAML (as
//! the file store writes it) that reads back to the same document and
//! the same config; a refused one names field paths.

use std::path::Path;

use gatehouse_config::doc;
use gatehouse_node::{merge_patch, named_entry};
use serde_json::Value;

use crate::config::round_trip;

const EXAMPLE: &str = include_str!("../../examples/gatehouse.yaml");

/// The example config's document, parsed once per thread.
fn example(file: &Path) -> gatehouse_config::yaml::Node {
    thread_local!(static EXAMPLE_DOC: std::cell::OnceCell<gatehouse_config::yaml::Node> = const { std::cell::OnceCell::new() });
    EXAMPLE_DOC.with(|d| {
        d.get_or_init(|| match gatehouse_config::parse_document(EXAMPLE, file) {
            Ok(doc) => doc,
            Err(e) => panic!("the example config does not parse: {e}"),
        })
        .clone()
    })
}

pub fn run(data: &[u8]) {
    let Some((&choices, body)) = data.split_first() else { return };
    let Ok(Value::Object(fields)) = serde_json::from_slice::<Value>(body) else { return };
    let file = Path::new("gatehouse.yaml");
    let mut document = example(file);
    let kind = doc::KINDS[usize::from(choices & 3) % doc::KINDS.len()];
    let patch = choices & 4 != 0;
    let existing = doc::entries(&document, kind, None).first().and_then(|e| {
        let name = doc::entry_name(kind, e)?.to_string();
        Some((name, doc::to_json(e)))
    });
    let (name, value) = match (patch, existing) {
        (true, Some((name, mut base))) => {
            merge_patch(&mut base, &Value::Object(fields));
            (name, base)
        }
        _ => ("fuzzed".to_string(), Value::Object(fields)),
    };
    let Ok(entry) = named_entry(&format!("{kind}/{name}"), &name, value) else { return };
    let Ok((list, _)) = doc::entries_mut(&mut document, kind, None) else { return };
    match list.iter().position(|e| doc::entry_name(kind, e) == Some(name.as_str())) {
        Some(i) => list[i] = doc::from_json(&entry),
        None => list.push(doc::from_json(&entry)),
    }
    match gatehouse_config::from_node(&document, file) {
        Ok(_) => round_trip(&document),
        Err(e) => assert!(!e.errors.is_empty(), "refused with no error"),
    }
}
