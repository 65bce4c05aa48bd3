//! The Pareto report of a protection-placement exploration, rendered from `explore.json`
//! ([`ExploreResult`], written by `faultline explore`). Per campaign: a table of every plan's
//! costs (cycles, check bits) beside its residual failure FIT, outcome shares, coverage of the
//! caught share of what mattered, false positives and paired changes; two figures of residual FIT
//! against each cost with the Pareto front; and each forward GEMM's ABFT cost beside its
//! arithmetic intensity and Kosaian & Rashmi's rule.
//!
//! Written as `pareto.md` and `index.html` (one list of [`Block`]s through
//! [`crate::markdown`] and [`crate::html`], as the campaign report is), `pareto.csv` and
//! `figures/pareto-*.{svg,png}`.

pub mod compare;
mod figures;

pub use compare::p_value;
pub use figures::write_figures;

use crate::document::{fit, pct, pct_of, Block, Row};
use crate::error::{ReportError, Result};
use crate::figures::Figure;
use crate::tables::{csv_error, writer};
use crate::write_file;
use faultline_fault::explore::{CampaignResult, ExploreResult, Interval, LayerAbft, PlanResult};
use faultline_fault::stats::paired::mcnemar_exact;
use faultline_fault::stats::Estimate;
use figures::figure_prefix;
use std::path::{Path, PathBuf};

/// What [`write_pareto`] wrote.
#[derive(Debug, Clone)]
pub struct ParetoWritten {
    /// `index.html`.
    pub html: PathBuf,
    /// `pareto.md`.
    pub markdown: PathBuf,
    /// `pareto.csv`.
    pub csv: PathBuf,
    /// `comparisons.csv`: every pair of plans.
    pub comparisons: PathBuf,
    /// Figures written (an SVG and a PNG each).
    pub figures: usize,
}

/// Writes the Pareto report of `result` into `out` (created if missing): `index.html`,
/// `pareto.md`, `pareto.csv`, `comparisons.csv` and `figures/pareto-*.{svg,png}`.
pub fn write_pareto(result: &ExploreResult, out: &Path) -> Result<ParetoWritten> {
    std::fs::create_dir_all(out).map_err(ReportError::io(out))?;
    let figures = write_figures(result, out)?;
    let blocks = build(result, &figures);
    let markdown = write_file(out, "pareto.md", crate::markdown::render(&blocks))?;
    let title = format!("Faultline exploration: {}", result.name);
    let html = write_file(out, "index.html", crate::html::render(&title, &blocks))?;
    let csv = out.join("pareto.csv");
    write_csv(result, &csv)?;
    let comparisons = out.join("comparisons.csv");
    compare::write_csv(result, &comparisons)?;
    Ok(ParetoWritten { html, markdown, csv, comparisons, figures: figures.len() })
}

/// Index of the unprotected baseline among `c.plans`: the plan named `none`, else the first.
fn baseline(c: &CampaignResult) -> Option<usize> {
    c.plans.iter().position(|p| p.plan == "none").or((!c.plans.is_empty()).then_some(0))
}

/// A FIT interval as the tables show it: `307 [190, 470]`, three significant digits.
pub fn fit_interval(i: Interval) -> String {
    format!("{} [{}, {}]", fit(i.p), fit(i.lo), fit(i.hi))
}

/// Layer ABFT overhead of the variant the intensity rule picks for `l`.
fn guided_overhead(l: &LayerAbft) -> f64 {
    if l.rule_picks == "global" {
        l.global_overhead
    } else {
        l.tile_overhead
    }
}

/// Per-layer ABFT overheads summed over `layers`: (always global, intensity-guided).
pub fn abft_sums(layers: &[LayerAbft]) -> (f64, f64) {
    (layers.iter().map(|l| l.global_overhead).sum(), layers.iter().map(guided_overhead).sum())
}

/// Head of the plan table.
const PLAN_HEAD: [&str; 12] = [
    "plan",
    "cycles",
    "cycle overhead %",
    "check bits",
    "residual failure FIT [95% CI]",
    "failure % [95% CI]",
    "detected % [95% CI]",
    "corrected % [95% CI]",
    "coverage: caught of caught + failed % [95% CI]",
    "false positives (steps)",
    "Pareto: point / at 95%",
    "failures removed/added of paired trials",
];

/// One plan's row of the plan table.
fn plan_cells(p: &PlanResult, is_baseline: bool) -> Vec<String> {
    vec![
        p.plan.clone(),
        p.cycles.to_string(),
        format!("{:.2}", 100.0 * p.cycle_overhead),
        p.area_bits.to_string(),
        fit_interval(p.failure_fit),
        pct([p.failure.p, p.failure.lo, p.failure.hi]),
        pct_of(p.detected),
        pct_of(p.corrected),
        // Nothing caught or failed: nothing to cover, and Wilson's [0, 1] would read as data.
        if p.coverage.n == 0 { "-".into() } else { pct_of(p.coverage) },
        format!("{}/{}", p.false_positives.k, p.false_positives.n),
        format!("{} / {}", yes(p.pareto), yes(p.front_at_confidence)),
        if is_baseline {
            "-".into()
        } else {
            format!("{}/{} of {}", p.failures_removed, p.failures_added, p.paired_trials)
        },
    ]
}

/// `yes`, or a dash.
fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "\u{2014}"
    }
}

/// `global / tile` overhead of one layer as the layer table shows it.
fn ratio(global: f64, tile: f64) -> String {
    if tile > 0.0 {
        format!("{:.2}x", global / tile)
    } else {
        "-".into()
    }
}

/// The per-layer table.
fn layer_table(layers: &[LayerAbft]) -> Block {
    Block::Table {
        head: [
            "node",
            "layer",
            "M\u{d7}K\u{d7}N",
            "intensity (MACs/word)",
            "global ABFT overhead %",
            "per-tile ABFT overhead %",
            "ratio global/per-tile",
            "intensity rule picks",
        ]
        .map(String::from)
        .to_vec(),
        rows: layers
            .iter()
            .map(|l| Row {
                cells: vec![
                    format!("`{}`", l.node),
                    l.layer.clone(),
                    format!("{}\u{d7}{}\u{d7}{}", l.gemm[0], l.gemm[1], l.gemm[2]),
                    format!("{:.2}", l.intensity),
                    format!("{:.2}", 100.0 * l.global_overhead),
                    format!("{:.2}", 100.0 * l.tile_overhead),
                    ratio(l.global_overhead, l.tile_overhead),
                    l.rule_picks.clone(),
                ],
                strong: false,
            })
            .collect(),
        text_columns: 3,
    }
}

/// Cycle overhead under which Li et al. (2021) report their detection rate.
const LI_OVERHEAD: f64 = 0.20;

/// The sentence under the layer table: the summed per-layer overheads of always-global and
/// intensity-guided ABFT and their ratio, set beside the published figures. Every judgement
/// in it is derived from the numbers, so it says what this exploration measured.
pub fn abft_summary(c: &CampaignResult) -> String {
    if c.layers.is_empty() {
        return "No forward GEMM in this campaign: no per-layer ABFT costs.".into();
    }
    let (global, guided) = abft_sums(&c.layers);
    let r = global / guided;
    let ratio = if guided > 0.0 { format!("{r:.2}x") } else { "n/a".into() };
    let here = if global <= 0.0 && guided <= 0.0 {
        "no measurable overhead either way".to_string()
    } else if guided <= 0.0 {
        format!("the guided choice adds no measurable cycles, always global {:.2} %", 100.0 * global)
    } else if ratio == "1.00x" {
        "no gain (1.00x)".to_string()
    } else if r > 1.0 {
        format!("{ratio} lower")
    } else {
        format!("{:.2}x higher ({ratio})", 1.0 / r)
    };
    let base = baseline(c);
    let best = c
        .plans
        .iter()
        .enumerate()
        .filter(|&(i, p)| Some(i) != base && p.coverage.n > 0 && p.cycle_overhead < LI_OVERHEAD)
        .map(|(_, p)| p)
        // Highest coverage; on a tie the cheaper plan, then the first.
        .fold(None::<&PlanResult>, |best, p| match best {
            Some(b) if (b.coverage.p, -b.cycle_overhead) >= (p.coverage.p, -p.cycle_overhead) => Some(b),
            _ => Some(p),
        });
    let li = match best {
        Some(p) => format!(
            "the plan catching (detecting or correcting) the largest share of what mattered under {:.0} % cycle overhead \
             is `{}`: {} % at {:.2} % overhead",
            100.0 * LI_OVERHEAD,
            p.plan,
            pct_of(p.coverage),
            100.0 * p.cycle_overhead
        ),
        None => format!("no plan under {:.0} % cycle overhead caught or failed anything", 100.0 * LI_OVERHEAD),
    };
    format!(
        "Summed over the {} layers (each measured alone, so the sums approximate guarding all of them): always \
         global {:.2} % of the step, intensity-guided (the rule's pick per layer) {:.2} %; ratio always-global / \
         intensity-guided: {ratio}. Kosaian & Rashmi (SC'21) report intensity-guided ABFT at 1.09\u{2013}5.3x lower \
         overhead than global ABFT; here: {here}. Li et al. (2021) report >95% detection at <20% overhead for int8 \
         GEMM ABFT; here: {li}.",
        c.layers.len(),
        100.0 * global,
        100.0 * guided,
    )
}

/// What the noise allows this campaign's plans to claim, in words: whether their residual
/// FIT intervals overlap the baseline's (then FIT cannot rank them), and which plans' paired
/// changes McNemar's exact test calls beyond chance.
pub fn noise_summary(c: &CampaignResult) -> String {
    let Some(base) = baseline(c) else { return "No plans.".into() };
    let b = c.plans[base].failure_fit;
    let others: Vec<&PlanResult> = c.plans.iter().enumerate().filter(|&(i, _)| i != base).map(|(_, p)| p).collect();
    let apart = apart_from_baseline(c, base);
    let fit = if others.is_empty() {
        String::new()
    } else if apart.is_empty() {
        format!(
            "Residual FIT: every plan's 95% interval overlaps the unprotected `{}`'s ({}), so on FIT the \
             differences between plans are within the noise of this campaign. ",
            c.plans[base].plan,
            fit_interval(b)
        )
    } else {
        format!(
            "Residual FIT: {} {} below the unprotected interval ({}); the other plans' intervals overlap it \
             (within the noise). ",
            apart.join(", "),
            agree(apart.len(), "lies", "lie"),
            fit_interval(b)
        )
    };
    let mut sharp: Vec<String> = Vec::new();
    let mut chance: Vec<String> = Vec::new();
    for p in &others {
        if p.failures_removed + p.failures_added == 0 {
            continue;
        }
        let q = mcnemar_exact(p.failures_removed, p.failures_added);
        let text = format!("`{}` ({}/{}, {})", p.plan, p.failures_removed, p.failures_added, p_value(q));
        if q < compare::level(c) {
            sharp.push(text);
        } else {
            chance.push(text);
        }
    }
    let mut parts = Vec::new();
    if !sharp.is_empty() {
        parts.push(format!("beyond chance at {}: {}", compare::level_words(c), sharp.join(", ")));
    }
    if !chance.is_empty() {
        parts.push(format!("within chance: {}", chance.join(", ")));
    }
    let paired = if parts.is_empty() {
        "Paired trials: no plan changed any paired trial's failure.".to_string()
    } else {
        format!(
            "Paired trials (failures removed/added of the same faults, McNemar's exact test) are the sharper \
             comparison: {}.",
            parts.join("; ")
        )
    };
    format!("{fit}{paired}")
}

/// The plans of `c` other than the baseline `base` whose residual-FIT interval lies clear of
/// the baseline's, as `` `name` ``: the ones FIT tells apart from no protection.
fn apart_from_baseline(c: &CampaignResult, base: usize) -> Vec<String> {
    let b = c.plans[base].failure_fit;
    c.plans
        .iter()
        .enumerate()
        .filter(|&(i, p)| i != base && !p.failure_fit.overlaps(b))
        .map(|(_, p)| format!("`{}`", p.plan))
        .collect()
}

/// `one` for a single subject, `many` otherwise: a verb that agrees with a list of plans.
fn agree(n: usize, one: &'static str, many: &'static str) -> &'static str {
    if n == 1 {
        one
    } else {
        many
    }
}

/// The exploration's executive summary: per campaign, the Pareto plans and what the noise
/// allows to claim.
fn summary(result: &ExploreResult) -> Vec<Block> {
    let items = result
        .campaigns
        .iter()
        .map(|c| {
            let pareto: Vec<String> = c.plans.iter().filter(|p| p.pareto).map(|p| format!("`{}`", p.plan)).collect();
            let base = baseline(c);
            let apart = base.map(|b| apart_from_baseline(c, b)).unwrap_or_default();
            let sharp: Vec<String> = c
                .plans
                .iter()
                .enumerate()
                .filter(|&(i, _)| Some(i) != base)
                .map(|(_, p)| p)
                .filter(|p| p.failures_removed > p.failures_added)
                .filter(|p| mcnemar_exact(p.failures_removed, p.failures_added) < compare::level(c))
                .map(|p| format!("`{}`", p.plan))
                .collect();
            let rounds = compare::rounds(c).map_or(String::new(), |r| r + " ");
            let decided = if c.comparisons.is_empty() { String::new() } else { compare::decision(c) + " " };
            format!(
                "**{}** ({} on {}, {} trials per plan): {rounds}{decided}Pareto-optimal on point estimates {}. On residual FIT \
                 {}. On paired trials with the baseline {}.",
                c.campaign,
                c.model,
                c.hw,
                c.trials,
                if pareto.is_empty() { "none".into() } else { pareto.join(", ") },
                if apart.is_empty() {
                    "every plan is within the noise: its 95% interval overlaps the unprotected one's".to_string()
                } else {
                    let verb = agree(apart.len(), "differs", "differ");
                    format!("{} {verb} from unprotected; the rest are within the noise", apart.join(", "))
                },
                if sharp.is_empty() {
                    format!(
                        "no plan removes more failures than it adds beyond chance (McNemar's exact test, {})",
                        compare::level_words(c)
                    )
                } else {
                    let (verb, adds) =
                        (agree(sharp.len(), "removes", "remove"), agree(sharp.len(), "it adds", "they add"));
                    format!(
                        "{} {verb} more failures than {adds} beyond chance (McNemar's exact test, {})",
                        sharp.join(", "),
                        compare::level_words(c)
                    )
                }
            )
        })
        .collect();
    vec![Block::Heading(2, "Summary".into()), Block::List(items)]
}

/// The report's blocks: an introduction, then per campaign its plan table, its figures
/// (those of `figures` named after it) and its per-layer ABFT table.
pub fn build(result: &ExploreResult, figures: &[Figure]) -> Vec<Block> {
    let mut b = vec![Block::Heading(1, format!("Faultline exploration: {}", result.name))];
    b.push(Block::Section { id: "summary".into(), blocks: summary(result) });
    b.push(Block::Heading(2, "What was compared".into()));
    b.push(Block::Para(format!(
        "Every protection plan against each campaign, on the trials of the unprotected baseline (`none`): a \
         plan that adds no instruction runs the very same faults; one that adds checks runs each register \
         fault at the same point of the same instruction of its longer step, and draws memory faults afresh \
         (their words hold other buffers there). The paired column compares each paired trial with itself \
         unprotected. Residual failure FIT is the raw FIT per bit ({}) times the sampled classes' bits times \
         their failure share (stratified by bits, per unit of training work: the unprotected step's time), \
         with its 95% interval; shares carry 95% Wilson intervals. A plan is Pareto-optimal when no other plan on its campaign has \
         lower-or-equal residual FIT, check bits and cycle overhead with one of them strictly lower. False \
         positives count the fault-free steps of a held-out run in which a check fired.",
        result.fit_per_bit
    )));
    for (ci, c) in result.campaigns.iter().enumerate() {
        b.push(Block::Heading(
            2,
            format!(
                "{} ({} on {}, {} trials per plan, unprotected step {} cycles)",
                c.campaign, c.model, c.hw, c.trials, c.base_cycles
            ),
        ));
        b.push(Block::Heading(3, "Plans".into()));
        b.push(Block::Para(noise_summary(c)));
        let base = baseline(c);
        b.push(Block::Table {
            head: PLAN_HEAD.map(String::from).to_vec(),
            rows: c
                .plans
                .iter()
                .enumerate()
                .map(|(i, p)| Row { cells: plan_cells(p, Some(i) == base), strong: false })
                .collect(),
            text_columns: 1,
        });
        if !c.comparisons.is_empty() {
            b.push(Block::Heading(3, "Plan against plan".into()));
            b.push(Block::Para(compare::table_intro(c)));
            b.push(compare::table(c));
        }
        let prefix = figure_prefix(result, ci);
        let figs: Vec<Figure> = figures.iter().filter(|f| f.name.starts_with(&prefix)).cloned().collect();
        if !figs.is_empty() {
            b.push(Block::Para(
                "Filled markers: Pareto-optimal in (residual FIT, check bits, cycle overhead); hollow: dominated. \
                 Whiskers: the FIT's 95% interval (cut, with an arrow, above 4x the largest estimate). The step line is the front in the figure's two axes alone, so \
                 a filled point above it is optimal through the other cost."
                    .into(),
            ));
            b.extend(figs.into_iter().map(Block::Figure));
        }
        b.push(Block::Heading(3, "ABFT per layer".into()));
        if !c.layers.is_empty() {
            b.push(Block::Para(
                "Each forward GEMM's step cycle overhead with global or per-tile ABFT added to it alone, beside its \
                 arithmetic intensity `MNK / (MK + KN + MN)` and the variant Kosaian & Rashmi's intensity rule picks."
                    .into(),
            ));
            b.push(layer_table(&c.layers));
        }
        b.push(Block::Para(abft_summary(c)));
    }
    b
}

/// A float as CSV text: Rust's shortest round-trip form.
fn num(x: f64) -> String {
    x.to_string()
}

/// An estimate's CSV cells: k, n, p, lo, hi.
fn estimate_cells(e: Estimate) -> [String; 5] {
    [e.k.to_string(), e.n.to_string(), num(e.p), num(e.lo), num(e.hi)]
}

/// Writes `pareto.csv`: one row per (campaign, plan) with every number of the plan table
/// (shares as fractions, as `summary.csv` has them; estimates as k, n, p, lo, hi). Coverage
/// with nothing caught or failed and the baseline's paired counts are empty, as `-` in the table.
pub fn write_csv(result: &ExploreResult, path: &Path) -> Result<()> {
    let mut w = writer(path)?;
    let mut head: Vec<String> = [
        "campaign",
        "model",
        "hw",
        "trials",
        "base_cycles",
        "plan",
        "file",
        "cycles",
        "cycle_overhead",
        "area_bits",
        "failure_fit",
        "failure_fit_lo",
        "failure_fit_hi",
        "failure",
        "failure_lo",
        "failure_hi",
    ]
    .map(String::from)
    .to_vec();
    for e in ["detected", "corrected", "unrecovered", "coverage", "false_positives"] {
        head.extend([format!("{e}_k"), format!("{e}_n"), e.to_string(), format!("{e}_lo"), format!("{e}_hi")]);
    }
    head.extend(
        ["pareto", "front_at_confidence", "paired_trials", "failures_removed", "failures_added"].map(String::from),
    );
    w.write_record(&head).map_err(|e| csv_error(path, e))?;
    for c in &result.campaigns {
        let base = baseline(c);
        for (i, p) in c.plans.iter().enumerate() {
            let mut row = vec![
                c.campaign.clone(),
                c.model.clone(),
                c.hw.clone(),
                c.trials.to_string(),
                c.base_cycles.to_string(),
                p.plan.clone(),
                p.file.clone().unwrap_or_default(),
                p.cycles.to_string(),
                num(p.cycle_overhead),
                p.area_bits.to_string(),
            ];
            row.extend([p.failure_fit.p, p.failure_fit.lo, p.failure_fit.hi].map(num));
            row.extend([p.failure.p, p.failure.lo, p.failure.hi].map(num));
            row.extend(estimate_cells(p.detected));
            row.extend(estimate_cells(p.corrected));
            row.extend(estimate_cells(p.unrecovered));
            let mut coverage = estimate_cells(p.coverage);
            if p.coverage.n == 0 {
                coverage[2..].iter_mut().for_each(|c| c.clear());
            }
            row.extend(coverage);
            row.extend(estimate_cells(p.false_positives));
            row.push(p.pareto.to_string());
            row.push(p.front_at_confidence.to_string());
            if Some(i) == base {
                row.extend([String::new(), String::new(), String::new()]);
            } else {
                row.extend([p.paired_trials.to_string(), p.failures_removed.to_string(), p.failures_added.to_string()]);
            }
            w.write_record(&row).map_err(|e| csv_error(path, e))?;
        }
    }
    w.flush().map_err(ReportError::io(path))
}
