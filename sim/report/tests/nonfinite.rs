//! A record's non-finite loss deltas, written by name (`"NaN"`, `"Infinity"`, `"-Infinity"`)
//! or as the `null` of older records, load into the report's loss curves as those values.

use faultline_hw::budget::HostMemory;
use faultline_report::load::load;
use std::fs;
use std::path::Path;

const FIXTURE: &str = "tests/fixtures/tiny";
/// The fixture's one record whose loss ends non-finite (trial 128, `ShortTermInfNan`), up to
/// that last delta (`null` in records written before the names, `"NaN"` since).
const DELTAS: &str = "\"loss_delta\":[0.0,0.0,8.342725512752035e+33,";

/// The loss deltas of trial 128 loaded from the fixture with its last delta written as `last`.
fn curve_with(last: &str) -> Vec<f64> {
    let dir = tempfile::tempdir().unwrap();
    fs::copy(Path::new(FIXTURE).join("campaign.json"), dir.path().join("campaign.json")).unwrap();
    let records = fs::read_to_string(Path::new(FIXTURE).join("records.jsonl")).unwrap();
    assert_eq!(records.matches(DELTAS).count(), 1, "the fixture changed: pick another record");
    let (head, tail) = records.split_once(DELTAS).unwrap();
    let rest = &tail[tail.find(']').unwrap()..];
    fs::write(dir.path().join("records.jsonl"), format!("{head}{DELTAS}{last}{rest}")).unwrap();
    let trace = load(dir.path(), &HostMemory::default(), |_, _| {}).unwrap();
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
