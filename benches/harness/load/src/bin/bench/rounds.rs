//! How many rounds the report's medians are over, in words. Runs are
//! merged (`--merge`), so one report can hold rows of 3 rounds beside rows
//! of 5: one number for all of them (the largest, as the report once
//! printed) was wrong for most rows.

use std::collections::{BTreeMap, BTreeSet};

use crate::scenarios::Measurement;

/// "3 rounds per row" when every row (a scenario, a server, a variant) has
/// the same count; else the usual count and the rows that differ, by
/// scenario: "3 rounds per row, except 5 for raw-tcp-echo in scenario 1
/// and for every row of scenario 8".
pub fn describe<'a>(measurements: impl IntoIterator<Item = &'a Measurement>) -> String {
    let mut rows: BTreeMap<(u8, &str, &str), BTreeSet<usize>> = BTreeMap::new();
    for m in measurements {
        rows.entry((m.scenario, &m.server, &m.variant))
            .or_default()
            .insert(m.round);
    }
    let mut rows_with: BTreeMap<usize, usize> = BTreeMap::new();
    for rounds in rows.values() {
        *rows_with.entry(rounds.len()).or_default() += 1;
    }
    // The count most rows have (the smaller on a tie).
    let Some(usual) = rows_with
        .iter()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
        .map(|(&rounds, _)| rounds)
    else {
        return "no rounds".into();
    };
    // The other counts: by count, then scenario, the servers (or all rows).
    let mut odd: BTreeMap<(usize, u8), BTreeSet<&str>> = BTreeMap::new();
    for (&(scenario, server, _), rounds) in &rows {
        if rounds.len() != usual {
            odd.entry((rounds.len(), scenario))
                .or_default()
                .insert(server);
        }
    }
    let plural = |n: usize| if n == 1 { "round" } else { "rounds" };
    if odd.is_empty() {
        return format!("{usual} {} per row", plural(usual));
    }
    let mut parts = Vec::new();
    let mut last = None;
    for (&(count, scenario), servers) in &odd {
        let whole = rows
            .iter()
            .filter(|((s, _, _), _)| *s == scenario)
            .all(|((_, server, _), rounds)| rounds.len() == count && servers.contains(server));
        let which = if whole {
            format!("every row of scenario {scenario}")
        } else {
            let servers: Vec<&str> = servers.iter().copied().collect();
            format!("{} in scenario {scenario}", join(&servers))
        };
        // The count once per run of rows that share it.
        if last == Some(count) {
            parts.push(format!("for {which}"));
        } else {
            parts.push(format!("{count} for {which}"));
        }
        last = Some(count);
    }
    format!(
        "{usual} {} per row, except {}",
        plural(usual),
        join(&parts.iter().map(String::as_str).collect::<Vec<_>>())
    )
}

/// "a", "a and b", "a, b and c".
fn join(items: &[&str]) -> String {
    match items {
        [] => String::new(),
        [one] => (*one).to_owned(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(list: &[(u8, &str, usize)]) -> Vec<Measurement> {
        let mut all = Vec::new();
        for &(scenario, server, rounds) in list {
            for round in 0..rounds {
                all.push(Measurement {
                    scenario,
                    variant: String::new(),
                    server: server.into(),
                    round,
                    metrics: Default::default(),
                    error: None,
                });
            }
        }
        all
    }

    #[test]
    fn one_count_for_all_rows_is_said_once() {
        let all = rows(&[(1, "a", 3), (1, "b", 3), (2, "a", 3)]);
        assert_eq!(describe(&all), "3 rounds per row");
    }

    #[test]
    fn the_rows_that_differ_are_named() {
        let all = rows(&[
            (1, "a", 3),
            (1, "raw", 5),
            (2, "a", 3),
            (2, "b", 3),
            (8, "a", 5),
            (8, "b", 5),
        ]);
        assert_eq!(
            describe(&all),
            "3 rounds per row, except 5 for raw in scenario 1 and for every row of scenario 8"
        );
    }
}
