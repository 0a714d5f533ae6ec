//! The Prometheus text exposition every plane writes into.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

/// A Prometheus text-format document being written.
pub struct Exposition {
    text: String,
}

impl Default for Exposition {
    fn default() -> Self {
        Exposition { text: String::with_capacity(16 * 1024) }
    }
}

impl Exposition {
    /// A metric's `# HELP` and `# TYPE` lines.
    pub fn header(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    /// One sample line.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
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
}
