//! The config file (`gatehouse-config`): YAML text to a document, the
//! document to a decoded and validated config. Input: the file's text.
//!
//! Properties: no panic; a document written back as YAML by the emitter
//! the admin API uses to store it (`doc::emit`) parses to the same
//! document, and decodes to the same config or is refused at the same
//! field paths.

use std::path::Path;

use gatehouse_config::doc::{emit, to_json};
use gatehouse_config::yaml::{Node, Value};
use gatehouse_config::{ConfigErrors, from_node, parse_document};

/// The same tree without line numbers, and with plain scalars that read
/// as strings marked as quoted ones: the emitter quotes any text it cannot
/// write plain, which is the same string (a plain scalar that reads as a
/// boolean or a number must stay one).
pub fn shape(n: &Node) -> Node {
    let value = match &n.value {
        Value::Seq(items) => Value::Seq(items.iter().map(shape).collect()),
        Value::Map(entries) => Value::Map(entries.iter().map(|(k, v)| (shape(k), shape(v))).collect()),
        Value::Scalar { text, plain: true } if to_json(n).is_string() => {
            Value::Scalar { text: text.clone(), plain: false }
        }
        v => v.clone(),
    };
    Node { line: 0, value }
}

/// The field paths of a refusal (lines differ between two texts).
pub fn paths(e: &ConfigErrors) -> Vec<&str> {
    e.errors.iter().map(|f| f.path.as_str()).collect()
}

/// Writes `doc` as YAML, parses it again, and checks nothing changed.
pub fn round_trip(doc: &Node) {
    let file = Path::new("fuzz.yaml");
    let text = emit(doc);
    let again = match parse_document(&text, file) {
        Ok(d) => d,
        Err(e) => panic!("the emitted document does not parse ({e}):\n{text}"),
    };
    assert_eq!(shape(&again), shape(doc), "the document changed when written and read:\n{text}");
    match (from_node(doc, file), from_node(&again, file)) {
        (Ok(a), Ok(b)) => assert_eq!(a, b),
        (Err(a), Err(b)) => assert_eq!(paths(&a), paths(&b)),
        (a, b) => panic!("decoded differently: {:?} / {:?}", a.is_ok(), b.is_ok()),
    }
}

pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(doc) = parse_document(text, Path::new("fuzz.yaml")) else { return };
    round_trip(&doc);
}
