//! Plan against plan: what the paired trials of an exploration can and cannot decide. Every
//! pair of plans on a campaign ([`PlanComparison`]) as a table and a CSV, and in words the front
//! at the stated confidence, the plans on it that cannot be told apart, and how many paired
//! trials would tell them apart.

use crate::document::{about, fit, Block, Row};
use crate::error::{ReportError, Result};
use crate::tables::{csv_error, writer};
use faultline_fault::explore::{CampaignResult, ExploreResult, PlanComparison, Stopped, CONFIDENCE, POWER};
use std::path::Path;

/// A p-value as a reader should see it: two decimals, and small ones not rounded to zero.
pub fn p_value(q: f64) -> String {
    if q < 0.001 {
        "p < 0.001".into()
    } else if q < 0.01 {
        format!("p = {q:.3}")
    } else {
        format!("p = {q:.2}")
    }
}

/// `` `a` `` and `` `b` `` as a plan pair.
fn pair(c: &PlanComparison) -> String {
    format!("`{}` and `{}`", c.first, c.second)
}

/// How many paired trials would separate the pair, in words.
fn to_separate(c: &PlanComparison) -> String {
    let Some(n) = c.trials_needed else { return "no trial pairs them".into() };
    let k = c.counts;
    if k.first_only != k.second_only {
        format!("about {} paired trials would separate them at the difference seen", about(n))
    } else {
        format!("separating them would take at least about {} paired trials, if they differ at all", about(n))
    }
}

/// The pair's verdict in a few words, for the command line: `told apart (p = 0.03)` or
/// `tied, 1/0 of 2000 paired; ~16,000 to separate`.
pub fn verdict(c: &PlanComparison) -> String {
    if c.separated {
        return format!("told apart ({})", p_value(c.p_value));
    }
    let k = c.counts;
    format!("tied, {}/{} of {} paired; {}", k.first_only, k.second_only, k.n(), need_short(c))
}

/// The paired trials that would separate a pair, in a few words: `~16,000 to separate`, or
/// `>= ~4,100 to separate` where the plans failed alike (sized at the largest difference
/// their interval allows).
fn need_short(c: &PlanComparison) -> String {
    let k = c.counts;
    c.trials_needed.map_or("-".into(), |n| {
        let at_least = if k.first_only == k.second_only { ">= " } else { "" };
        format!("{at_least}~{} to separate", about(n))
    })
}

/// The level McNemar's exact test tells plans apart at on campaign `c`: 5%, or its share per
/// look when the exploration ran in rounds.
pub fn level(c: &CampaignResult) -> f64 {
    c.rounds.as_ref().map_or(1.0 - CONFIDENCE, |r| r.alpha)
}

/// [`level`] in words: `5%`, or `0.625% per look`.
pub fn level_words(c: &CampaignResult) -> String {
    match &c.rounds {
        None => format!("{:.0}%", 100.0 * level(c)),
        Some(r) => format!("{}% per look", fit(100.0 * r.alpha)),
    }
}

/// The rounds an exploration ran on campaign `c`, and why it stopped, in words; `None` for an
/// exploration of one round.
pub fn rounds(c: &CampaignResult) -> Option<String> {
    let r = c.rounds.as_ref()?;
    let why = match r.stopped {
        Stopped::Separated => "every pair whose order could change the front at 95% was told apart",
        Stopped::Futile => "each pair left tied would need more paired trials than the rounds allowed give",
        Stopped::Budget => "the rounds allowed had run",
    };
    Some(format!(
        "It ran {} of at most {} rounds of {} trials per plan and stopped because {why}. Each look tested at {}% \
         so that {:.0}% confidence holds over all of them (Bonferroni).",
        r.run,
        r.max,
        r.trials_per_round,
        fit(100.0 * r.alpha),
        100.0 * CONFIDENCE
    ))
}

/// The front at [`CONFIDENCE`], in words: the plans on it, the pairs of point-estimate
/// Pareto plans the paired trials cannot tell apart (with the trials that would), and those
/// they can.
pub fn decision(c: &CampaignResult) -> String {
    let pct = (100.0 * CONFIDENCE).round();
    let front: Vec<String> =
        c.plans.iter().filter(|p| p.front_at_confidence).map(|p| format!("`{}`", p.plan)).collect();
    let mut s = format!(
        "At {pct}% confidence the front, where each plan fails demonstrably less than every cheaper plan (failure \
         rates the paired trials cannot tell apart count as equal), is {}.",
        if front.is_empty() { "empty".to_string() } else { front.join(", ") }
    );
    let on_front = |name: &str| c.plans.iter().any(|p| p.plan == name && p.pareto);
    let pairs: Vec<&PlanComparison> =
        c.comparisons.iter().filter(|x| on_front(&x.first) && on_front(&x.second)).collect();
    let tied: Vec<String> = (pairs.iter().filter(|x| !x.separated))
        .map(|x| {
            let k = x.counts;
            format!(
                "{} ({}/{} failed under one only of {} paired, {}; {})",
                pair(x),
                k.first_only,
                k.second_only,
                k.n(),
                p_value(x.p_value),
                to_separate(x)
            )
        })
        .collect();
    let apart: Vec<String> =
        (pairs.iter().filter(|x| x.separated)).map(|x| format!("{} ({})", pair(x), p_value(x.p_value))).collect();
    if !tied.is_empty() {
        s += &format!(
            " Of the point-estimate Pareto plans, these cannot be told apart on failures (McNemar's exact test, \
             {}): {}.",
            level_words(c),
            tied.join("; ")
        );
    }
    if !apart.is_empty() {
        s += &format!(" Told apart: {}.", apart.join("; "));
    }
    s
}

/// A difference of shares in percent with its interval, signed, three significant digits
/// (differences weighted by class bits are often far below 0.01%): `+0.05 [-0.103, +0.21]`.
fn diff_pct(d: faultline_fault::stats::Interval) -> String {
    let signed = |x: f64| {
        let x = 100.0 * x;
        if x == 0.0 {
            "0".to_string()
        } else {
            format!("{}{}", if x < 0.0 { "-" } else { "+" }, fit(x.abs()))
        }
    };
    format!("{} [{}, {}]", signed(d.p), signed(d.lo), signed(d.hi))
}

/// Head of the comparison table.
const HEAD: [&str; 7] = [
    "first",
    "second",
    "paired trials",
    "failed under first only / second only",
    "difference in failure % (first - second) [95% CI]",
    "McNemar exact p",
    "told apart at 95%",
];

/// Every pair of plans of `c`, one row each.
pub fn table(c: &CampaignResult) -> Block {
    let rows = (c.comparisons.iter())
        .map(|x| Row {
            cells: vec![
                x.first.clone(),
                x.second.clone(),
                x.counts.n().to_string(),
                format!("{} / {}", x.counts.first_only, x.counts.second_only),
                diff_pct(x.difference),
                p_value(x.p_value).trim_start_matches("p ").trim_start_matches("= ").to_string(),
                if x.separated { "yes".into() } else { format!("no: {}", need_short(x)) },
            ],
            strong: x.separated,
        })
        .collect();
    Block::Table { head: HEAD.map(String::from).to_vec(), rows, text_columns: 2 }
}

/// The paragraph above the comparison table.
pub fn table_intro(c: &CampaignResult) -> String {
    format!(
        "Every pair of plans on the trials paired under both (the same fault, or a register fault moved to the \
         same point of the same instruction). Only the trials that failed under one plan alone tell plans apart: \
         McNemar's exact test asks whether they split more unevenly than chance, and the difference in failure \
         share carries Newcombe's interval per class, combined by class bits. Where a pair is not told apart, the \
         last column gives the paired trials that would separate it with {:.0}% power (Connor 1987) at the \
         difference observed, or, where none was observed (`>=`), at least those at the largest the interval \
         allows; this campaign ran {} per plan.",
        100.0 * POWER,
        c.trials
    )
}

/// Writes `comparisons.csv`: one row per (campaign, pair of plans).
pub fn write_csv(result: &ExploreResult, path: &Path) -> Result<()> {
    let mut w = writer(path)?;
    let head = [
        "campaign",
        "first",
        "second",
        "paired_trials",
        "both_failed",
        "first_only",
        "second_only",
        "neither_failed",
        "difference",
        "difference_lo",
        "difference_hi",
        "p_value",
        "separated",
        "trials_needed",
    ];
    w.write_record(head).map_err(|e| csv_error(path, e))?;
    for c in &result.campaigns {
        for x in &c.comparisons {
            let k = x.counts;
            let row = [
                c.campaign.clone(),
                x.first.clone(),
                x.second.clone(),
                k.n().to_string(),
                k.both.to_string(),
                k.first_only.to_string(),
                k.second_only.to_string(),
                k.neither.to_string(),
                x.difference.p.to_string(),
                x.difference.lo.to_string(),
                x.difference.hi.to_string(),
                x.p_value.to_string(),
                x.separated.to_string(),
                x.trials_needed.map_or(String::new(), |n| n.to_string()),
            ];
            w.write_record(&row).map_err(|e| csv_error(path, e))?;
        }
    }
    w.flush().map_err(ReportError::io(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_p_values_are_not_rounded_to_zero() {
        assert_eq!(p_value(2.0 * 0.5f64.powi(14)), "p < 0.001");
        assert_eq!(p_value(0.0039), "p = 0.004");
        assert_eq!(p_value(0.126), "p = 0.13");
    }
}
