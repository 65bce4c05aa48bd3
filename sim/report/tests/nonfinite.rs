//! A record's non-finite loss deltas, written by name (`"NaN"`, `"Infinity"`, `"-Infinity"`)
//! or as the `null` of older records, load into the report's loss curves as those values.

use faultline_report::load::load;
use std::fs;
use std::path::Path;

/// The fixture's one record whose loss ends non-finite (trial 128, `ShortTermInfNan`), which
/// holds `null` there as records written before the names do.
const FIXTURE: &str = "tests/fixtures/tiny";
const OLD: &str = "\"loss_delta\":[0.0,0.0,8.342725512752035e+33,null]";

/// The loss deltas of trial 128 loaded from the fixture with its last delta written as `last`.
fn curve_with(last: &str) -> Vec<f64> {
    let dir = tempfile::tempdir().unwrap();
    fs::copy(Path::new(FIXTURE).join("campaign.json"), dir.path().join("campaign.json")).unwrap();
    let records = fs::read_to_string(Path::new(FIXTURE).join("records.jsonl")).unwrap();
    assert_eq!(records.matches(OLD).count(), 1, "the fixture changed: pick another record");
    let new = OLD.replace("null]", &format!("{last}]"));
    fs::write(dir.path().join("records.jsonl"), records.replace(OLD, &new)).unwrap();
    let trace = load(dir.path(), |_, _| {}).unwrap();
    let c = trace.curves.iter().find(|c| c.trial == 128).expect("trial 128 has a loss curve");
    assert_eq!(&c.loss_delta[..3], &[0.0, 0.0, 8.342725512752035e+33]);
    c.loss_delta.clone()
}

#[test]
fn named_and_null_loss_deltas_load_as_written() {
    assert_eq!(curve_with("\"Infinity\"")[3].to_bits(), f64::INFINITY.to_bits());
    assert_eq!(curve_with("\"-Infinity\"")[3].to_bits(), f64::NEG_INFINITY.to_bits());
    assert!(curve_with("\"NaN\"")[3].is_nan());
    assert!(curve_with("null")[3].is_nan());
    assert_eq!(curve_with("1.5")[3], 1.5);
}
