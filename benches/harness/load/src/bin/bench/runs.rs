//! Which run measured each table. Runs are merged (`--merge`), so one
//! report holds tables measured hours or days apart: results.json keeps,
//! for every scenario, the run its table came from (a scenario run again
//! replaces its whole table), and the report dates each table by it.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

/// The run that measured one scenario's table.
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    /// When it started, `YYYY-MM-DD HH:MM UTC`.
    pub when: String,
    /// The machine, as `Machine: ...` says it.
    pub machine: String,
    /// The command it was started with.
    pub command: String,
    /// Seconds of warm-up before each measured window.
    pub warmup: f64,
    /// Seconds of each measured window.
    pub duration: f64,
}

impl Run {
    fn to_json(&self) -> Value {
        json!({
            "when": self.when, "machine": self.machine, "command": self.command,
            "warmup": self.warmup, "duration": self.duration,
        })
    }

    fn from_json(value: &Value) -> Option<Run> {
        Some(Run {
            when: value["when"].as_str()?.to_string(),
            machine: value["machine"].as_str()?.to_string(),
            command: value["command"].as_str()?.to_string(),
            warmup: value["warmup"].as_f64()?,
            duration: value["duration"].as_f64()?,
        })
    }

    /// The line under a table's heading: when, the command, the rounds
    /// (`rounds::describe` of the table's rows), the window and the machine.
    pub fn line(&self, rounds: &str) -> String {
        format!(
            "Measured {}: `{}`; {rounds}; each window {} s after {} s of warm-up. {}",
            self.when, self.command, self.duration, self.warmup, self.machine
        )
    }
}

/// The line under a table whose run was not kept (measured before runs
/// were kept per table).
pub fn undated(rounds: &str) -> String {
    format!(
        "Measured before each table kept the run it came from: its date and command are not known ({rounds}). The next run of this scenario replaces it."
    )
}

/// Every table's run, as results.json keeps it: an object keyed by the
/// scenario's number.
pub fn to_json(tables: &BTreeMap<u8, Run>) -> Value {
    Value::Object(
        tables
            .iter()
            .map(|(scenario, run)| (scenario.to_string(), run.to_json()))
            .collect::<Map<_, _>>(),
    )
}

/// [`to_json`]'s inverse; what is missing or malformed is left out (its
/// table is then undated).
pub fn from_json(value: &Value) -> BTreeMap<u8, Run> {
    let Some(tables) = value.as_object() else {
        return BTreeMap::new();
    };
    tables
        .iter()
        .filter_map(|(scenario, run)| Some((scenario.parse().ok()?, Run::from_json(run)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(when: &str) -> Run {
        Run {
            when: when.into(),
            machine: "Machine: 2 CPUs.".into(),
            command: "benches/harness/run.sh --scenarios 6".into(),
            warmup: 1.0,
            duration: 5.0,
        }
    }

    #[test]
    fn tables_survive_results_json() {
        let tables = BTreeMap::from([
            (1, run("2026-11-29 14:00 UTC")),
            (6, run("2026-11-29 15:00 UTC")),
        ]);
        let text = serde_json::to_string(&to_json(&tables)).unwrap();
        assert_eq!(from_json(&serde_json::from_str(&text).unwrap()), tables);
    }

    #[test]
    fn a_malformed_entry_is_left_undated() {
        let value = json!({"1": run("t").to_json(), "x": run("t").to_json(), "2": {"when": "t"}});
        assert_eq!(from_json(&value).keys().copied().collect::<Vec<_>>(), [1]);
        assert!(from_json(&json!(null)).is_empty());
    }

    #[test]
    fn the_line_names_the_run() {
        let line = run("2026-11-29 14:00 UTC").line("3 rounds per row");
        assert_eq!(
            line,
            "Measured 2026-11-29 14:00 UTC: `benches/harness/run.sh --scenarios 6`; 3 rounds per row; each window 5 s after 1 s of warm-up. Machine: 2 CPUs."
        );
    }
}
