//! `faultline plan` as a user runs it: a timed pilot of the campaign's own trials, each class's
//! trials for the margin, and the designs side by side, Neyman's never above uniform sampling's
//! at the same estimates; bad flags refused in one line.

mod common;
use common::faultline;

/// The number in column `col` (whitespace-separated, from the right) of the line starting with
/// `start`.
fn number(out: &str, start: &str, from_right: usize) -> f64 {
    let line = out.lines().find(|l| l.starts_with(start)).unwrap_or_else(|| panic!("no `{start}` in\n{out}"));
    let cells: Vec<&str> = line.split_whitespace().collect();
    cells[cells.len() - 1 - from_right].parse().unwrap_or_else(|_| panic!("{line}"))
}

#[test]
fn plans_every_class_and_compares_the_designs() {
    let o = faultline(&["plan", "configs/campaign-mlp-8x8.ron", "--pilot", "20", "--margin", "0.01", "--threads", "2"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        out.starts_with("plan for campaign mlp-8x8 (mlp-digits on tpu-8x8): the failure rate to within 1.00 points")
    );
    assert!(out.contains("pilot: 20 trials per class"), "{out}");
    // Every class of the spec has a row; worst case p = 0.5 over a large population is
    // Leveugle's 9,604 for a 1-point margin (fewer for a small one).
    let seq = out.lines().find(|l| l.starts_with("seq.tile")).expect("seq.tile row");
    assert!(seq.split_whitespace().count() >= 9, "{seq}");
    assert_eq!(number(&out, "ub.word[*]", 3), 9604.0, "{out}");
    // Trials of the designs: Neyman at most uniform at the same estimates, which is at most
    // the worst case.
    let (worst, uniform, neyman) = (
        number(&out, "Uniform, worst case", 2),
        number(&out, "Uniform at the pilot", 2),
        number(&out, "Neyman allocation", 2),
    );
    assert!(neyman <= uniform && uniform <= worst, "{out}");
}

#[test]
fn bad_flags_are_refused_in_one_line() {
    for (args, says) in [
        (&["--margin", "0"][..], "--margin"),
        (&["--margin", "0.7"], "(0, 0.5]"),
        (&["--relative", "x"], "not a number"),
        (&["--confidence", "1"], "--confidence"),
        (&["--pilot", "1"], "--pilot"),
    ] {
        let mut all = vec!["plan", "configs/campaign-mlp-8x8.ron"];
        all.extend(args);
        let o = faultline(&all);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.lines().next().unwrap().contains(says), "{args:?}: {err}");
    }
}
