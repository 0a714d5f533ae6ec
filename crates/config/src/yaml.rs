//! A YAML document as a tree of nodes that remember their line.
//!
//! yaml-rust2's own `Yaml` type forgets where a value came from, and a config
//! error that says "line 42" saves a user a search. This module owns the
//! translation from parser events to [`Node`]s and nothing else: it does not
//! interpret scalars (that is the decoder's job, which knows the expected type).

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// One YAML value with the (1-based) line it starts on.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub line: usize,
    pub value: Value,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A scalar as written. `plain` is false for quoted scalars, which are
    /// always strings ("true" in quotes is not a boolean).
    Scalar {
        text: String,
        plain: bool,
    },
    Seq(Vec<Node>),
    /// Keys in document order. Duplicate keys are rejected by [`parse`].
    Map(Vec<(Node, Node)>),
    Null,
}

impl Node {
    pub fn kind(&self) -> &'static str {
        match &self.value {
            Value::Scalar { .. } => "a scalar",
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
            Value::Null => "null",
        }
    }

    /// The text of a scalar, or `None` for anything else.
    pub fn scalar(&self) -> Option<&str> {
        match &self.value {
            Value::Scalar { text, .. } => Some(text),
            _ => None,
        }
    }
}

/// A syntax error, with its line.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntaxError {
    pub line: usize,
    pub message: String,
}

/// Parses one YAML document. An empty document is `Null`.
pub fn parse(source: &str) -> Result<Node, SyntaxError> {
    let mut builder = TreeBuilder::default();
    let mut parser = Parser::new_from_str(source);
    parser
        .load(&mut builder, false)
        .map_err(|e| SyntaxError { line: e.marker().line(), message: e.info().to_string() })?;
    if let Some(err) = builder.error {
        return Err(err);
    }
    Ok(builder.root.unwrap_or(Node { line: 1, value: Value::Null }))
}

enum Open {
    Seq(usize, Vec<Node>),
    Map(usize, Vec<(Node, Node)>, Option<Node>),
}

#[derive(Default)]
struct TreeBuilder {
    stack: Vec<Open>,
    root: Option<Node>,
    error: Option<SyntaxError>,
}

impl TreeBuilder {
    fn fail(&mut self, line: usize, message: impl Into<String>) {
        if self.error.is_none() {
            self.error = Some(SyntaxError { line, message: message.into() });
        }
    }

    fn push_node(&mut self, node: Node) {
        match self.stack.last_mut() {
            None => {
                if self.root.is_none() {
                    self.root = Some(node);
                }
            }
            Some(Open::Seq(_, items)) => items.push(node),
            Some(Open::Map(_, entries, pending_key)) => match pending_key.take() {
                None => {
                    // Every key of a config is a field name: a list, a
                    // mapping or null there has no meaning (and could not
                    // be written back). Found by the config fuzz target.
                    let not_a_name = key_kind(&node);
                    let line = node.line;
                    *pending_key = Some(node);
                    if let Some(kind) = not_a_name {
                        self.fail(line, format!("a key must be a name, found {kind}"));
                    }
                }
                Some(key) => {
                    let duplicate = entries.iter().any(|(k, _)| k.value == key.value);
                    entries.push((key, node));
                    if duplicate && let Some((key, _)) = entries.last() {
                        let message = format!("duplicate key {:?}", key.scalar().unwrap_or("?"));
                        let line = key.line;
                        self.fail(line, message);
                    }
                }
            },
        }
    }
}

/// What a key is when it is not a name.
fn key_kind(key: &Node) -> Option<&'static str> {
    match key.value {
        Value::Scalar { .. } => None,
        _ => Some(key.kind()),
    }
}

impl MarkedEventReceiver for TreeBuilder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        let line = mark.line();
        // A tag (`!name`, `!!str`) would change what a value means in a way
        // the decoder does not read: refused rather than dropped.
        if let Event::Scalar(_, _, _, Some(_)) | Event::SequenceStart(_, Some(_)) | Event::MappingStart(_, Some(_)) =
            &ev
        {
            self.fail(line, "YAML tags (!name) are not supported in Gatehouse config");
        }
        match ev {
            Event::Scalar(text, style, _, _) => {
                let plain = style == TScalarStyle::Plain;
                let value = if plain && matches!(text.as_str(), "" | "~" | "null" | "Null" | "NULL") {
                    Value::Null
                } else {
                    Value::Scalar { text, plain }
                };
                self.push_node(Node { line, value });
            }
            Event::SequenceStart(..) => self.stack.push(Open::Seq(line, Vec::new())),
            Event::MappingStart(..) => self.stack.push(Open::Map(line, Vec::new(), None)),
            Event::SequenceEnd | Event::MappingEnd => {
                let node = match self.stack.pop() {
                    Some(Open::Seq(line, items)) => Node { line, value: Value::Seq(items) },
                    Some(Open::Map(line, entries, _)) => Node { line, value: Value::Map(entries) },
                    None => return,
                };
                self.push_node(node);
            }
            Event::Alias(_) => {
                self.fail(line, "YAML aliases are not supported in Gatehouse config");
                self.push_node(Node { line, value: Value::Null });
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_values_keep_their_lines() {
        let doc = "a: 1\nb:\n  - x\n  - \"true\"\nc: ~\n";
        let root = parse(doc).expect("parses");
        let Value::Map(entries) = &root.value else { panic!("not a map") };
        assert_eq!(entries.len(), 3);
        assert_eq!(entries[1].0.line, 2);
        let Value::Seq(items) = &entries[1].1.value else { panic!("not a seq") };
        assert_eq!(items[1].line, 4);
        assert_eq!(items[1].value, Value::Scalar { text: "true".into(), plain: false });
        assert_eq!(entries[2].1.value, Value::Null);
    }

    #[test]
    fn duplicate_keys_are_an_error() {
        let err = parse("a: 1\nb: 2\na: 3\n").expect_err("duplicate");
        assert_eq!(err.line, 3);
        assert!(err.message.contains("duplicate key"), "{}", err.message);
    }

    #[test]
    fn keys_are_names_and_tags_are_refused() {
        for (doc, says) in [
            ("a: 1\n? [x]\n: 2\n", "a key must be a name, found a list"),
            ("a:\n  {b: 1}: 2\n", "a key must be a name, found a mapping"),
            ("~: 1\n", "a key must be a name, found null"),
            ("a: !secret 1\n", "YAML tags"),
            ("a: !!str 1\n", "YAML tags"),
        ] {
            let err = parse(doc).expect_err(doc);
            assert!(err.message.contains(says), "{doc:?}: {}", err.message);
        }
    }

    #[test]
    fn syntax_errors_carry_a_line() {
        let err = parse("a: [1, 2\nb: 3\n").expect_err("unclosed");
        assert!(err.line >= 1);
    }
}
