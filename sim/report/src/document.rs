//! The report's content as a list of blocks (headings, paragraphs, tables, figures, PE
//! grids), built once from a [`Report`] and rendered by [`crate::markdown`] and [`crate::html`]:
//! both files say the same thing by construction.

use crate::aggregate::ties;
use crate::aggregate::{bit_field, Counts, GroupRow, Heatmap, Report, MIN_CELL_TRIALS, NOT_SIMULATED};
use crate::figures::{heat_scale, Figure, HeatScale, Section};
use crate::load::Trace;
use faultline_fault::record::CampaignInfo;
use faultline_fault::spec::{Mode, Sampling};
use faultline_fault::stats::design::trials_for_relative;
use faultline_fault::stats::{Estimate, Z95};
use faultline_fault::Outcome;
use serde::Serialize;

/// A table row; `strong` rows are totals.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Cell texts (inline code in backticks).
    pub cells: Vec<String>,
    /// Shown bold.
    pub strong: bool,
}

/// One block of the report.
#[derive(Debug, Clone)]
pub enum Block {
    /// A heading of level 1-3.
    Heading(u8, String),
    /// A paragraph (inline code in backticks).
    Para(String),
    /// A bulleted list.
    List(Vec<String>),
    /// A table: header, rows; columns after the first `text_columns` are right-aligned numbers.
    Table {
        /// Column names.
        head: Vec<String>,
        /// Rows.
        rows: Vec<Row>,
        /// Leading text columns.
        text_columns: usize,
    },
    /// A figure (Markdown links the file, HTML inlines the SVG).
    Figure(Figure),
    /// A PE array on the report's one colour scale (HTML: a grid of cells, or of blocks of
    /// PEs when single PEs have too few trials, with hover titles; Markdown: its figure).
    Grid(Heatmap, Option<Figure>, HeatScale),
    /// Blocks set apart under an anchor `id` (HTML: a `<section id>`; Markdown: the blocks).
    Section {
        /// Anchor and CSS class.
        id: String,
        /// Its content.
        blocks: Vec<Block>,
    },
}

/// Share as a percentage with its 95% interval: `12.3 [9.1, 16.2]`.
pub fn pct(e: [f64; 3]) -> String {
    format!("{:.1} [{:.1}, {:.1}]", 100.0 * e[0], 100.0 * e[1], 100.0 * e[2])
}

/// [`pct`] of an estimate.
pub fn pct_of(e: Estimate) -> String {
    pct([e.p, e.lo, e.hi])
}

/// A FIT figure with three significant digits.
pub fn fit(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else {
        let digits = (2 - x.abs().log10().floor() as i32).max(0) as usize;
        format!("{x:.digits$}")
    }
}

/// A spec value in the spec's own RON syntax.
fn ron<T: Serialize>(v: &T) -> String {
    ron::to_string(v).unwrap_or_else(|e| format!("({e})"))
}

/// `path` relative to the working directory when it lies inside it (campaign.json records the
/// spec file's absolute path; a report reads better, and moves better, with the short one).
fn shown(path: &str) -> String {
    let p = std::path::Path::new(path);
    std::env::current_dir()
        .ok()
        .and_then(|cwd| p.strip_prefix(cwd).ok().map(|r| r.display().to_string()))
        .unwrap_or_else(|| path.to_string())
}

/// The run description: everything needed to reproduce the campaign.
fn run_description(info: &CampaignInfo, dir: &str) -> Vec<String> {
    let s = &info.spec;
    let spec_file = shown(&info.spec_file);
    let t = &s.train;
    let mut v = vec![
        format!("campaign `{}` ({:?}), spec file `{spec_file}`", s.name, s.mode),
        format!("model `{}`, machine `{}` (`{}`)", s.model.display(), info.hw, s.hw.display()),
        format!(
            "training: batch {}, optimizer {}, lr {}, precision {}, seed {}, data {}",
            t.batch,
            ron(&t.optimizer),
            t.lr.map_or("default".into(), |x| x.to_string()),
            t.precision.map_or("the machine's".into(), |p| p.to_string()),
            t.seed,
            t.data.as_ref().map_or("built-in".into(), |d| format!("`{}`", d.display())),
        ),
        format!(
            "golden run: {} steps, {} cycles and {} instructions per step, final test accuracy {:.4}, state checksum `{}`",
            s.golden_steps,
            info.cycles_per_step,
            info.instructions_per_step,
            info.golden.test_accuracy,
            info.golden.final_checksum
        ),
        format!("sites `{}`", s.sites.join("`, `")),
        format!(
            "fault `{}`, injection steps `{}`, sampling `{}` ({} trials), campaign seed {}",
            ron(&s.fault),
            ron(&s.inject_steps),
            ron(&s.sampling),
            info.trials,
            s.seed
        ),
        format!(
            "judging: follow-up {} steps, thresholds `{}`, dead faults skipped: {} (every {}th run to check)",
            s.follow_up,
            ron(&s.thresholds),
            s.skip_dead,
            s.verify_dead_every
        ),
        format!("raw FIT per bit: {}", s.fit_per_bit.map_or("not given (no FIT columns)".into(), |f| f.to_string())),
        format!("code: {}", info.code),
        format!("reproduce: `faultline campaign {spec_file} --out {dir}`, then `faultline report {dir} --out DIR`"),
    ];
    if s.mode == Mode::Inference {
        v.retain(|l| !l.starts_with("judging"));
    }
    if matches!(s.sampling, Sampling::Adaptive { .. }) {
        v.push(
            "adaptive sampling drew only faults that may be live: the class, unit, combined and per-bit rates \
             count the provably dead rest as masked (per bit, each class's rates among its trials times its live \
             share), while the per-PE, per-step and per-phase figures are shares of the live trials (a PE's or a \
             step's live share differs from its class's)"
                .into(),
        );
    }
    v
}

/// The outcomes some trial had, in table order: the per-group tables' columns.
fn present(r: &Report) -> Vec<Outcome> {
    r.outcomes.iter().copied().filter(|&o| r.classes.iter().any(|c| c.counts.of(o) > 0)).collect()
}

/// A row of outcome counts with the two shares.
fn counts_cells(r: &Report, c: &Counts) -> Vec<String> {
    let mut v = vec![c.trials().to_string()];
    v.extend(present(r).iter().map(|&o| c.of(o).to_string()));
    v.push(pct_of(c.unmasked()));
    v.push(pct_of(c.failure()));
    v
}

/// Header of [`counts_cells`] after `first` columns.
fn counts_head(r: &Report, first: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = first.iter().map(|s| s.to_string()).collect();
    v.push("trials".into());
    v.extend(present(r).iter().map(|o| o.name().to_string()));
    v.push("vulnerability % [95% CI]".into());
    v.push("failure % [95% CI]".into());
    v
}

/// A breakdown table.
fn breakdown(r: &Report, what: &str, rows: &[GroupRow]) -> Block {
    Block::Table {
        head: counts_head(r, &[what]),
        rows: rows
            .iter()
            .map(|g| {
                let mut cells = vec![g.name.clone()];
                cells.extend(counts_cells(r, &g.counts));
                Row { cells, strong: g.name == NOT_SIMULATED }
            })
            .collect(),
        text_columns: 1,
    }
}

/// The report's blocks: its sections in order.
pub fn build(trace: &Trace, r: &Report, figures: &[Figure]) -> Vec<Block> {
    // FIT columns only when the spec gives a raw FIT per bit.
    let fit_given = trace.info.spec.fit_per_bit.is_some();
    let mut b = vec![Block::Heading(1, format!("Faultline report: {}", trace.info.spec.name))];
    // The answer first: the reader who stops after one block has read the findings.
    b.push(Block::Section { id: "summary".into(), blocks: summary(trace, r) });
    b.extend(overview(trace, r));
    b.extend(outcomes(r));
    b.extend(by_unit(fit_given, r));
    b.extend(by_class(fit_given, r));
    b.extend(ranking(fit_given, r));
    b.extend(pe_array(r, figures));
    b.extend(bit_position(r, figures));
    b.extend(landing(&trace.info, r, figures));
    b.extend(curves(figures));
    b
}

/// The figures of section `sec`, in order.
fn figures_of(figures: &[Figure], sec: Section) -> impl Iterator<Item = Figure> + '_ {
    figures.iter().filter(move |f| f.section == sec).cloned()
}

/// Failed trials below which a rate is called thin in the summary (a rule of thumb: the
/// Wilson interval of fewer than 5 events spans more than a factor of 3).
const THIN: u64 = 5;

/// Names of the 0-based entries `idx` of `names`, at most three, then "and N more".
fn some_names(names: &[String], idx: &[usize]) -> String {
    let mut v: Vec<String> = idx.iter().take(3).map(|&i| names[i].clone()).collect();
    if idx.len() > 3 {
        v.push(format!("{} more", idx.len() - 3));
    }
    match v.len() {
        0 => String::new(),
        1 => v.remove(0),
        n => format!("{} and {}", v[..n - 1].join(", "), v[n - 1]),
    }
}

/// Trials per group that would separate rates `p1 > p2` with non-overlapping 95% intervals
/// if the rates held (normal approximation), rounded up to two significant digits.
pub fn trials_to_separate(p1: f64, p2: f64) -> Option<u64> {
    if p1 <= p2 {
        return None;
    }
    let sd = (p1 * (1.0 - p1)).sqrt() + (p2 * (1.0 - p2)).sqrt();
    let n = (1.96 * sd / (p1 - p2)).powi(2).ceil();
    let unit = 10f64.powf((n.log10().floor() - 1.0).max(0.0));
    Some(((n / unit).ceil() * unit) as u64)
}

/// The most vulnerable of `items` (name, `[p, lo, hi]`, sorted by `p` descending): the top
/// one, and whether the next ones' intervals overlap it. Returns the sentence and whether the
/// top stands apart.
fn leader(what: &str, items: &[(String, [f64; 3], [f64; 3])]) -> (String, bool) {
    let intervals: Vec<[f64; 3]> = items.iter().map(|x| x.1).collect();
    let tied = ties(&intervals);
    let (name, v, f) = &items[0];
    let head = format!(
        "**Most vulnerable {what}:** {name}: {} % of its faults were not masked (failure {} %)",
        pct(*v),
        pct(*f)
    );
    if items.len() == 1 {
        return (format!("{head}."), true);
    }
    let names: Vec<String> = items.iter().map(|x| format!("{} ({} %)", x.0, pct(x.1))).collect();
    if tied[0].is_empty() {
        (format!("{head}, clearly ahead of the next, {}: their intervals do not overlap.", names[1]), true)
    } else {
        (
            format!(
                "{head}; its interval overlaps those of {}, so this campaign does not tell them apart.",
                some_names(&names, &tied[0])
            ),
            false,
        )
    }
}

/// The executive summary: the most vulnerable unit and class with their intervals, the
/// protection that buys the most, and whether the trials suffice to say so.
fn summary(trace: &Trace, r: &Report) -> Vec<Block> {
    let fail = if trace.info.spec.mode == Mode::Training { "made training fail" } else { "made inference fail" };
    let mut items = Vec::new();
    let mut apart = Vec::new();
    let mut units: Vec<(String, [f64; 3], [f64; 3])> =
        r.units.iter().map(|u| (u.unit.clone(), u.unmasked, u.failure)).collect();
    units.sort_by(|a, b| b.1[0].total_cmp(&a.1[0]));
    if !units.is_empty() {
        let (text, ok) = leader("unit", &units);
        items.push(text);
        apart.push(ok);
    }
    let mut classes: Vec<(String, [f64; 3], [f64; 3])> = r
        .classes
        .iter()
        .filter(|c| c.counts.trials() > 0)
        .map(|c| {
            let (u, f) = (c.unmasked, c.failure);
            (format!("`{}`", c.info.class), [u.p, u.lo, u.hi], [f.p, f.lo, f.hi])
        })
        .collect();
    classes.sort_by(|a, b| b.1[0].total_cmp(&a.1[0]));
    if !classes.is_empty() {
        let (text, ok) = leader("site class", &classes);
        items.push(text);
        apart.push(ok);
    }
    let s = &r.summary;
    if r.units.len() > 1 {
        let biggest = r.units.iter().max_by_key(|u| u.bits).expect("units");
        items.push(format!(
            "**All selected bits together:** vulnerability {} %, failure {} %. Each class counts by its bits, so \
             the largest unit ({}, {} of {} bits) sets this figure, whatever the small units' rates.",
            pct([s.unmasked.p, s.unmasked.lo, s.unmasked.hi]),
            pct([s.failure.p, s.failure.lo, s.failure.hi]),
            biggest.unit,
            biggest.bits,
            r.units.iter().map(|u| u.bits).sum::<u64>()
        ));
    }
    let tied = ties(&rank_intervals(r));
    let mut verdict = Vec::new();
    match r.ranking.first() {
        Some(top) if top.failures > 0 => {
            let fit = top
                .fit_per_protected_bit
                .map(|x| format!(", {} FIT removed per protected bit", fit_e(x)))
                .unwrap_or_default();
            let mut text = format!(
                "**Protect first:** `{}`: {:.2} [{:.2}, {:.2}] % of the faults in one of its bits {fail} ({} of {} \
                 trials){fit}, the highest per bit (ranking below).",
                top.class,
                100.0 * top.failure_per_bit,
                100.0 * top.failure_ci[0],
                100.0 * top.failure_ci[1],
                top.failures,
                top.trials
            );
            if !tied[0].is_empty() {
                text.push_str(&format!(
                    " Its interval overlaps those of ranks {}: they may buy as much.",
                    rank_list(&tied[0])
                ));
            }
            items.push(text);
            apart.push(tied[0].is_empty());
            if !tied[0].is_empty() {
                verdict.push(format!("the protection ranking's top is not separated from {}", rank_list(&tied[0])));
            }
            let thin: Vec<usize> = std::iter::once(0)
                .chain(tied[0].iter().copied())
                .filter(|&i| (1..THIN).contains(&r.ranking[i].failures))
                .collect();
            if !thin.is_empty() {
                let counts: Vec<u64> = thin.iter().map(|&i| r.ranking[i].failures).collect();
                let (lo, hi) = (counts.iter().min().expect("one"), counts.iter().max().expect("one"));
                let n = if lo == hi { format!("{lo}") } else { format!("{lo}\u{2013}{hi}") };
                let each = if thin.len() > 1 { " each" } else { "" };
                let s = if *hi == 1 { "" } else { "s" };
                verdict.push(format!("ranks {} rest on {n} failure{s}{each}", rank_list(&thin)));
            }
            if let Some(second) = r.ranking.get(1).filter(|_| !tied[0].is_empty()) {
                if let Some(n) = trials_to_separate(top.failure_per_bit, second.failure_per_bit) {
                    verdict.push(format!(
                        "about {n} trials per class (now {}) would separate #1 from #2 if their rates held",
                        top.trials
                    ));
                }
            }
        }
        _ => {
            let bound = r.ranking.iter().map(|k| k.failure_ci[1]).fold(0.0, f64::max);
            items.push(format!(
                "**Protect first:** nothing to choose: no trial {fail}; at 95% confidence every class's failure \
                 rate per faulty bit is at most {:.1} %.",
                100.0 * bound
            ));
            verdict.push("no failure was seen, so the campaign cannot rank protection".into());
            apart.push(false);
        }
    }
    let answer = if apart.iter().all(|&a| a) && verdict.is_empty() {
        "Yes: each leader above stands apart from the next (95% intervals do not overlap).".to_string()
    } else if apart.iter().any(|&a| a) {
        format!("Partly: {}.", verdict_text(&apart, &verdict))
    } else {
        format!("No: {}.", verdict_text(&apart, &verdict))
    };
    items.push(format!("**Enough trials to say so?** {answer}"));
    vec![Block::Heading(2, "Summary".into()), Block::List(items)]
}

/// The reasons behind a "partly" or "no": which leaders are tied, then `verdict`'s points.
fn verdict_text(apart: &[bool], verdict: &[String]) -> String {
    let mut v = Vec::new();
    let leaders = ["the most vulnerable unit", "the most vulnerable site class"];
    let tied: Vec<&str> = apart.iter().zip(leaders).filter(|(a, _)| !**a).map(|(_, l)| l).collect();
    if !tied.is_empty() {
        v.push(format!(
            "{} {} not separated from the next",
            tied.join(" and "),
            if tied.len() > 1 { "are" } else { "is" }
        ));
    }
    v.extend(verdict.iter().cloned());
    v.join("; ")
}

/// The title, what the trials were and what the rates mean, and the run's description.
fn overview(trace: &Trace, r: &Report) -> Vec<Block> {
    let info = &trace.info;
    let s = &r.summary;
    let mut b = vec![Block::Heading(2, "What was run".into())];
    let verb = if info.spec.mode == Mode::Training { "training" } else { "inference" };
    b.push(Block::Para(format!(
        "{} trials of one {} each during {verb} ({} simulated; {} provably dead, so not run and counted \
         `HwMasked`; {} dead ones run anyway, every one masked){}. Vulnerability is the share of faults \
         that changed the {} state; failure the share that made {verb} fail (non-finite values, a degraded \
         model{}).",
        s.trials,
        ron(&info.spec.fault),
        s.simulated,
        s.skipped_dead,
        s.verified_dead,
        if s.trials < info.trials {
            format!(" out of {} planned: the campaign is incomplete", info.trials)
        } else {
            String::new()
        },
        if info.spec.mode == Mode::Training { "training" } else { "output" },
        if info.spec.mode == Mode::Training { "" } else { ", changed predictions" },
    )));
    if trace.partial_last_line {
        b.push(Block::Para("The last line of `records.jsonl` was half-written and is not counted.".into()));
    }
    b.push(Block::List(run_description(info, &trace.dir.display().to_string())));
    b
}

/// Each outcome's share of the trials, and the combined estimates.
fn outcomes(r: &Report) -> Vec<Block> {
    let s = &r.summary;
    let all = Counts::of_shares(&s.outcomes);
    vec![
        Block::Heading(2, "Outcomes".into()),
        Block::Table {
            head: vec!["outcome".into(), "trials".into(), "share of the trials % [95% CI]".into()],
            rows: r
                .outcomes
                .iter()
                .map(|&o| Row {
                    cells: vec![o.name().into(), all.of(o).to_string(), pct_of(Estimate::of(all.of(o), all.trials()))],
                    strong: false,
                })
                .collect(),
            text_columns: 1,
        },
        Block::Para(format!(
            "Shares of the trials as sampled (a stratified plan over-samples small classes). The selected \
             classes as the machine holds them ({} estimate): vulnerability {} %, failure {} %.",
            s.unmasked.method,
            pct([s.unmasked.p, s.unmasked.lo, s.unmasked.hi]),
            pct([s.failure.p, s.failure.lo, s.failure.hi])
        )),
    ]
}

/// Rates per unit (with its failure FIT when the spec gives a FIT per bit: `fit_given`).
fn by_unit(fit_given: bool, r: &Report) -> Vec<Block> {
    let mut head: Vec<String> =
        ["unit", "bits", "trials", "vulnerability % [95% CI]", "failure % [95% CI]"].map(String::from).to_vec();
    if fit_given {
        head.push("failure FIT".into());
    }
    vec![
        Block::Heading(2, "Vulnerability by unit".into()),
        Block::Para(
            "Each unit's rates weight its classes by their bits (a stratified estimate), so a unit reads the \
             same whatever share of the trials each class got."
                .into(),
        ),
        Block::Table {
            head,
            rows: r
                .units
                .iter()
                .map(|u| {
                    let mut cells =
                        vec![u.unit.clone(), u.bits.to_string(), u.trials.to_string(), pct(u.unmasked), pct(u.failure)];
                    cells.extend(u.fit_failure.map(fit));
                    Row { cells, strong: false }
                })
                .collect(),
            text_columns: 1,
        },
    ]
}

/// A count of trials to two significant digits, with thousands separators: `15,000`.
pub fn about(n: u64) -> String {
    let digits = n.checked_ilog10().unwrap_or(0);
    let unit = 10u64.pow(digits.saturating_sub(1));
    let rounded = (n + unit / 2) / unit * unit;
    let s = rounded.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// Whether a class's failure rate `e` is known to within half of itself at 95% and, if not,
/// about how many trials would make it so ([`trials_for_relative`]): `enough`, `~1,400`, or
/// `>= ~9,200` where no trial failed (the rate may be lower still).
fn trials_needed(e: Estimate) -> String {
    let need = trials_for_relative(e.k, e.n, 0.5, Z95);
    if e.k > 0 && e.hi - e.p <= 0.5 * e.p && e.p - e.lo <= 0.5 * e.p {
        "enough".into()
    } else if e.k == 0 {
        format!(">= ~{}", about(need))
    } else {
        format!("~{}", about(need.max(e.n + 1)))
    }
}

/// Rates per site class, then their outcome counts: two tables, so the rates (the columns a
/// reader comes for) fit a page beside the class names.
fn by_class(fit_given: bool, r: &Report) -> Vec<Block> {
    let mut head: Vec<String> =
        ["class", "kind", "format", "bits", "trials", "vulnerability % [95% CI]", "failure % [95% CI]"]
            .map(String::from)
            .to_vec();
    if fit_given {
        head.push("failure FIT [95% CI]".into());
    }
    head.push("trials for failure ±50%".into());
    let mut counts_head: Vec<String> = ["class", "trials", "dead (not run)"].map(String::from).to_vec();
    counts_head.extend(present(r).iter().map(|o| o.name().to_string()));
    vec![
        Block::Heading(2, "Vulnerability by site class".into()),
        Block::Para(
            "The last column says whether a class's failure rate is known to within half of itself (95%), and if \
             not, about how many trials in it would make it so, at its current estimate; `>=` where no trial \
             failed, since the rate may be lower still (`faultline plan` sizes a whole campaign)."
                .into(),
        ),
        Block::Table {
            head,
            rows: r
                .classes
                .iter()
                .map(|c| {
                    let mut cells = vec![
                        format!("`{}`", c.info.class),
                        format!("{:?}", c.info.kind),
                        c.info.format.clone().unwrap_or_else(|| "-".into()),
                        c.info.bits.to_string(),
                        c.counts.trials().to_string(),
                        pct_of(c.unmasked),
                        pct_of(c.failure),
                    ];
                    cells.extend(c.fit_failure.map(|f| format!("{} [{}, {}]", fit(f[0]), fit(f[1]), fit(f[2]))));
                    cells.push(trials_needed(c.failure));
                    Row { cells, strong: false }
                })
                .collect(),
            text_columns: 3,
        },
        Block::Heading(3, "Outcomes by site class".into()),
        Block::Para(
            "Trials per outcome; `dead (not run)` of them were provably dead, so not simulated and counted \
             `HwMasked`."
                .into(),
        ),
        Block::Table {
            head: counts_head,
            rows: r
                .classes
                .iter()
                .map(|c| {
                    let mut cells =
                        vec![format!("`{}`", c.info.class), c.counts.trials().to_string(), c.skipped.to_string()];
                    cells.extend(present(r).iter().map(|&o| c.counts.of(o).to_string()));
                    Row { cells, strong: false }
                })
                .collect(),
            text_columns: 1,
        },
    ]
}

/// `#2–#4, #6`: 0-based ranks `ranks` (ascending) as 1-based runs.
pub fn rank_list(ranks: &[usize]) -> String {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &r in ranks {
        match runs.last_mut() {
            Some(run) if run.1 + 1 == r => run.1 = r,
            _ => runs.push((r, r)),
        }
    }
    runs.iter()
        .map(|&(a, b)| if a == b { format!("#{}", a + 1) } else { format!("#{}\u{2013}#{}", a + 1, b + 1) })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A failure FIT removed per protected bit (`0` or three significant digits in e-notation).
fn fit_e(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else {
        format!("{x:.2e}")
    }
}

/// The protection ranking's rows as `[p, lo, hi]` of failure per faulty bit, in rank order.
pub fn rank_intervals(r: &Report) -> Vec<[f64; 3]> {
    r.ranking.iter().map(|k| [k.failure_per_bit, k.failure_ci[0], k.failure_ci[1]]).collect()
}

/// Classes ranked by the failures one protected bit removes, with each rate's interval and
/// the ranks it cannot be told apart from.
fn ranking(fit_given: bool, r: &Report) -> Vec<Block> {
    let mut head: Vec<String> = [
        "rank",
        "class",
        "bits",
        "failure per faulty bit % [95% CI]",
        "failed / trials",
        "tied with (intervals overlap)",
        "share of failures %",
    ]
    .map(String::from)
    .to_vec();
    if fit_given {
        head.extend(["failure FIT".into(), "FIT removed per protected bit [95% CI]".into()]);
    }
    let tied = ties(&rank_intervals(r));
    vec![
        Block::Heading(2, "Where protection buys the most".into()),
        Block::Para(
            "Classes ranked by the failures one protected bit removes: the failure probability of a fault in \
             one of its bits (times the raw FIT per bit, when given), with its 95% interval and the failed \
             trials it rests on. A rank whose interval overlaps another's is `tied` with it: this campaign \
             cannot say which of the two buys more, so read tied ranks as one group (more trials narrow the \
             intervals). `share` is the class's part of the selected classes' failure rate; protecting the \
             top rows first removes the most failures per bit of protection."
                .into(),
        ),
        Block::Table {
            head,
            rows: r
                .ranking
                .iter()
                .zip(&tied)
                .enumerate()
                .map(|(i, (k, t))| {
                    let mut cells = vec![
                        (i + 1).to_string(),
                        format!("`{}`", k.class),
                        k.bits.to_string(),
                        format!(
                            "{:.2} [{:.2}, {:.2}]",
                            100.0 * k.failure_per_bit,
                            100.0 * k.failure_ci[0],
                            100.0 * k.failure_ci[1]
                        ),
                        format!("{} / {}", k.failures, k.trials),
                        if t.is_empty() { "\u{2014}".into() } else { rank_list(t) },
                        format!("{:.1}", 100.0 * k.share),
                    ];
                    cells.extend(k.fit_failure.map(fit));
                    cells.extend(k.fit_per_protected_bit.map(|x| {
                        let f = if k.failure_per_bit > 0.0 { x / k.failure_per_bit } else { 0.0 };
                        match f {
                            f if f > 0.0 => {
                                format!("{} [{}, {}]", fit_e(x), fit_e(f * k.failure_ci[0]), fit_e(f * k.failure_ci[1]))
                            }
                            _ => fit_e(x),
                        }
                    }));
                    Row { cells, strong: false }
                })
                .collect(),
            text_columns: 2,
        },
    ]
}

/// A PE grid per register kind with its heatmap figure (nothing without PE classes), all on
/// one colour scale.
fn pe_array(r: &Report, figures: &[Figure]) -> Vec<Block> {
    if r.heatmaps.is_empty() {
        return Vec::new();
    }
    let scale = heat_scale(r);
    let blocked = r.heatmaps.iter().any(|h| crate::figures::block_size(h) > 1);
    let mut b = vec![
        Block::Heading(2, "PE array".into()),
        Block::Para(format!(
            "Failure rate of the faults anchored in each PE, per register kind (row 0 at the top). One colour \
             scale for every grid of this report, here and in the figure files: from 0 % (pale yellow) to {:.0} % \
             or more (dark red). Cells with fewer than {MIN_CELL_TRIALS} trials are hatched, not coloured: too \
             few to estimate.{}",
            100.0 * scale.top,
            if blocked {
                " Where single PEs got too few trials, a cell is a square block of PEs (its size is under the grid) \
                 pooling their trials."
            } else {
                ""
            }
        )),
    ];
    for h in &r.heatmaps {
        let fig = figures
            .iter()
            .find(|f| {
                f.section == Section::Heatmap
                    && (f.name == format!("heatmap-{}", h.register) || f.title.contains(&h.class))
            })
            .cloned();
        b.push(Block::Heading(3, format!("`{}`", h.class)));
        b.push(Block::Grid(h.clone(), fig, scale.clone()));
    }
    b
}

/// Rates per field of each class's number format (sign, exponent, mantissa), with the bit
/// figures.
fn bit_position(r: &Report, figures: &[Figure]) -> Vec<Block> {
    let mut rows = Vec::new();
    for p in &r.bit_profiles {
        for (f, c, nbits) in bit_fields(p.format.as_deref(), &p.bits) {
            rows.push(Row {
                cells: vec![
                    format!("`{}`", p.class),
                    p.format.clone().unwrap_or_else(|| "-".into()),
                    f.to_string(),
                    nbits.to_string(),
                    c.trials().to_string(),
                    pct_of(p.over_all(c.unmasked())),
                    pct_of(p.over_all(c.failure())),
                ],
                strong: false,
            });
        }
    }
    let mut b = vec![
        Block::Heading(2, "Bit position".into()),
        Block::Para(
            "Which bits of a value matter: the share of faults in each field of the format (sign, exponent, \
             mantissa for floats; sign, magnitude for integers)."
                .into(),
        ),
        Block::Table {
            head: ["class", "format", "field", "bits", "trials", "vulnerability % [95% CI]", "failure % [95% CI]"]
                .map(String::from)
                .to_vec(),
            rows,
            text_columns: 3,
        },
    ];
    b.extend(figures_of(figures, Section::Bits).map(Block::Figure));
    b
}

/// The per-bit counts `bits` of a value in `format`, summed per field of the format: (field,
/// counts, bits in it), most significant field first, as a value's bits are written.
fn bit_fields<'a>(format: Option<&str>, bits: &'a [Counts]) -> Vec<(&'a str, Counts, u32)> {
    let mut fields: Vec<(&str, Counts, u32)> = Vec::new();
    for (bit, c) in bits.iter().enumerate().rev() {
        let f = bit_field(format, bit as u32);
        let f = if f.is_empty() { "all bits" } else { f };
        match fields.iter_mut().find(|x| x.0 == f) {
            Some(x) => {
                x.2 += 1;
                for (a, y) in x.1.outcomes.iter_mut().zip(c.outcomes) {
                    *a += y;
                }
            }
            None => fields.push((f, *c, 1)),
        }
    }
    fields
}

/// Where simulated faults struck: by phase (training), layer, instruction kind and step, with
/// the step figures.
fn landing(info: &CampaignInfo, r: &Report, figures: &[Figure]) -> Vec<Block> {
    let training = info.spec.mode == Mode::Training;
    let mut b = vec![
        Block::Heading(2, "When and where faults landed".into()),
        Block::Para(format!(
            "The instruction a simulated fault struck, by its graph node's phase and layer and by instruction \
             kind. Provably dead faults were not simulated, so the instruction is not resolved: they form the \
             `{NOT_SIMULATED}` row (all `HwMasked`)."
        )),
    ];
    if training {
        b.push(Block::Heading(3, "By training phase".into()));
        b.push(breakdown(r, "phase", &r.by_phase));
    }
    b.push(Block::Heading(3, "By layer".into()));
    b.push(breakdown(r, "layer", &r.by_layer));
    b.push(Block::Heading(3, "By instruction kind".into()));
    b.push(breakdown(r, "instruction", &r.by_op));
    b.push(Block::Heading(3, if training { "By injection step" } else { "By test batch" }.into()));
    b.push(breakdown(r, "step", &r.by_step));
    b.extend(figures_of(figures, Section::Step).map(Block::Figure));
    b
}

/// The golden run against a sample of faulty trials' curves (nothing without curve figures).
fn curves(figures: &[Figure]) -> Vec<Block> {
    let curves: Vec<Figure> = figures_of(figures, Section::Curves).collect();
    if curves.is_empty() {
        return Vec::new();
    }
    let mut b = vec![
        Block::Heading(2, "Training curves".into()),
        Block::Para(format!(
            "The golden run against a sample of faulty trials (up to {} per outcome, the first recorded): loss \
             from the injection step through the follow-up window, and test accuracy at the window's end.",
            crate::load::CURVES_PER_OUTCOME
        )),
    ];
    b.extend(curves.into_iter().map(Block::Figure));
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trial_counts_read_to_two_digits() {
        assert_eq!(about(15_683), "16,000");
        assert_eq!(about(7), "7");
        assert_eq!(about(1234567), "1,200,000");
        assert_eq!(about(99), "99");
        assert_eq!(about(995), "1,000");
    }

    #[test]
    fn trials_needed_says_enough_or_how_many() {
        // 30 of 300: Wilson [7.1, 13.9] around 10, within half of it.
        assert_eq!(trials_needed(Estimate::of(30, 300)), "enough");
        assert_eq!(trials_needed(Estimate::of(8, 300)), "~530");
        assert_eq!(trials_needed(Estimate::of(0, 300)), ">= ~9,200");
        assert_eq!(trials_needed(Estimate::of(1, 20)), "~200");
    }
}
