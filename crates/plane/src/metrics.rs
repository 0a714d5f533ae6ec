//! What every plane writes its metrics into: the Prometheus text exposition
//! of `/metrics`, or the same figures as JSON for the dashboard's `/stats`.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};

/// A metrics document being written: Prometheus text, or JSON (see
/// [`Exposition::json`]). Planes write both alike.
pub struct Exposition {
    text: String,
    /// The JSON form, when that is what is written.
    json: Option<Map<String, Value>>,
}

impl Default for Exposition {
    fn default() -> Self {
        Exposition { text: String::with_capacity(16 * 1024), json: None }
    }
}

impl Exposition {
    /// An exposition written as JSON, one member per metric:
    /// `{"type": "counter", "samples": [[{labels}, value], ...]}`, a
    /// histogram's samples as `[{labels}, {"le": [bounds], "buckets":
    /// [cumulative counts, the last for +Inf], "sum", "count"}]`.
    pub fn json() -> Self {
        Exposition { text: String::new(), json: Some(Map::new()) }
    }

    /// A metric's `# HELP` and `# TYPE` lines.
    pub fn header(&mut self, name: &str, kind: &str, help: &str) {
        if let Some(j) = &mut self.json {
            j.insert(name.to_string(), json!({ "type": kind, "samples": [] }));
            return;
        }
        let _ = writeln!(self.text, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    /// Appends a sample to a JSON metric (made untyped if it has no header).
    fn push_json(&mut self, name: &str, labels: &[(&str, &str)], value: Value) {
        let Some(j) = &mut self.json else { return };
        let metric = j.entry(name.to_string()).or_insert_with(|| json!({ "type": "untyped", "samples": [] }));
        let labels: Map<String, Value> = labels.iter().map(|(k, v)| ((*k).to_string(), Value::from(*v))).collect();
        if let Some(Value::Array(samples)) = metric.get_mut("samples") {
            samples.push(json!([labels, value]));
        }
    }

    /// One sample line.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        if self.json.is_some() {
            // Whole numbers stay integers; NaN and infinities become null.
            let text = value.to_string();
            let v = text.parse::<u64>().map(Value::from).unwrap_or_else(|_| {
                text.parse::<f64>().ok().and_then(serde_json::Number::from_f64).map_or(Value::Null, Value::Number)
            });
            return self.push_json(name, labels, v);
        }
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{k}=\"");
                escape_label(&mut self.text, v);
                self.text.push('"');
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {value}");
    }

    /// A histogram's `_bucket` (cumulative), `_sum` and `_count` lines;
    /// `buckets` has one count per bound and one for `+Inf`.
    pub fn histogram(&mut self, name: &str, labels: &[(&str, &str)], bounds: &[String], buckets: &[u64], sum: f64) {
        if self.json.is_some() {
            let cumulative: Vec<u64> = buckets
                .iter()
                .scan(0u64, |acc, n| {
                    *acc += n;
                    Some(*acc)
                })
                .collect();
            let count = cumulative.last().copied().unwrap_or(0);
            let le: Vec<Value> = bounds.iter().map(|b| b.parse::<f64>().map_or(Value::Null, Value::from)).collect();
            let h = json!({ "le": le, "buckets": cumulative, "sum": sum, "count": count });
            return self.push_json(name, labels, h);
        }
        let mut cumulative = 0;
        for (bound, n) in bounds.iter().map(String::as_str).chain(["+Inf"]).zip(buckets) {
            cumulative += n;
            let mut l = labels.to_vec();
            l.push(("le", bound));
            self.sample(&format!("{name}_bucket"), &l, cumulative);
        }
        self.sample(&format!("{name}_sum"), labels, sum);
        self.sample(&format!("{name}_count"), labels, cumulative);
    }

    pub fn into_text(self) -> String {
        self.text
    }

    /// The JSON form (an empty object for a text exposition).
    pub fn into_json(self) -> Value {
        Value::Object(self.json.unwrap_or_default())
    }
}

/// Escapes a label value (backslash, double quote, newline).
fn escape_label(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_escaped_and_histograms_cumulative() {
        let mut o = Exposition::default();
        o.sample("m", &[("a", "x\"y\\z\nw")], 1);
        o.histogram("h", &[("r", "q")], &["0.1".to_string(), "1".to_string()], &[2, 3, 1], 1.5);
        let text = o.into_text();
        assert!(text.contains("m{a=\"x\\\"y\\\\z\\nw\"} 1\n"), "{text}");
        assert!(text.contains("h_bucket{r=\"q\",le=\"0.1\"} 2\n"));
        assert!(text.contains("h_bucket{r=\"q\",le=\"1\"} 5\n"));
        assert!(text.contains("h_bucket{r=\"q\",le=\"+Inf\"} 6\n"));
        assert!(text.contains("h_count{r=\"q\"} 6\n"));
        assert!(text.contains("h_sum{r=\"q\"} 1.5\n"));
    }

    #[test]
    fn the_json_form_has_the_same_figures() {
        let mut o = Exposition::json();
        o.header("c", "counter", "help");
        o.sample("c", &[("a", "x\"y")], 7);
        o.sample("c", &[], 0.25);
        o.sample("g", &[], f64::NAN);
        o.header("h", "histogram", "help");
        o.histogram("h", &[("r", "q")], &["0.1".to_string(), "1".to_string()], &[2, 3, 1], 1.5);
        let j = o.into_json();
        assert_eq!(j["c"]["type"], "counter");
        assert_eq!(j["c"]["samples"][0], json!([{"a": "x\"y"}, 7]));
        assert_eq!(j["c"]["samples"][1], json!([{}, 0.25]));
        assert_eq!(j["g"], json!({"type": "untyped", "samples": [[{}, null]]}));
        assert_eq!(
            j["h"]["samples"][0],
            json!([{"r": "q"}, {"le": [0.1, 1.0], "buckets": [2, 5, 6], "sum": 1.5, "count": 6}])
        );
    }
}
