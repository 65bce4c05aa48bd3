//! Fuzz-style property tests of the campaign-file readers: `campaign.json` and `records.jsonl`
//! of a real campaign (the `tiny` fixture), mutated, read by every reader (`report`'s loader,
//! the summary and outcome readers, `merge`). Whatever the input: no panic, no allocation by
//! what the file claims, and either a value or an error that is exactly one line.

use faultline_fault::store;
use faultline_hw::budget::HostMemory;
use faultline_hw::fuzz::{apply, edit};
use faultline_report::aggregate::aggregate;
use faultline_report::load::load;
use proptest::prelude::*;
use std::path::Path;

const FIXTURE: &str = "tests/fixtures/tiny";

fn one_line<T, E: std::fmt::Display>(r: Result<T, E>) -> Result<(), TestCaseError> {
    if let Err(e) = r {
        prop_assert!(!e.to_string().contains('\n'), "multi-line error: {e}");
    }
    Ok(())
}

/// Every reader of a campaign directory, on `dir`; a report is also aggregated if it loads.
fn read_all(dir: &Path) -> Result<(), TestCaseError> {
    // 256 MiB: a loader that trusts a claimed size is refused, not run.
    let mem = HostMemory::new(256 << 20, "--max-memory");
    match load(dir, &mem, |_, _| {}) {
        Ok(t) => {
            aggregate(&t);
        }
        Err(e) => one_line::<(), _>(Err(e))?,
    }
    one_line(store::read_info(dir))?;
    one_line(store::outcomes(dir))?;
    let out = tempfile::tempdir().unwrap();
    one_line(store::merge(&out.path().join("m"), &[dir.to_path_buf()]))?;
    Ok(())
}

/// The fixture copied into a new directory, with `campaign.json` and the records as given.
fn campaign_dir(info: &str, records: &str) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("campaign.json"), info).unwrap();
    std::fs::write(d.path().join("records.jsonl"), records).unwrap();
    d
}

fn fixture(file: &str) -> String {
    std::fs::read_to_string(Path::new(FIXTURE).join(file)).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn mutated_campaign_descriptions_never_panic(edits in prop::collection::vec(edit(), 1..4)) {
        let d = campaign_dir(&apply(&fixture("campaign.json"), &edits), &fixture("records.jsonl"));
        read_all(d.path())?;
    }

    #[test]
    fn mutated_record_lines_never_panic(line in 0usize..360, edits in prop::collection::vec(edit(), 1..4),
                                        cut in any::<bool>()) {
        let records = fixture("records.jsonl");
        let mut lines: Vec<String> = records.lines().map(String::from).collect();
        lines[line] = apply(&lines[line], &edits);
        let mut text = lines.join("\n") + "\n";
        if cut {
            text.truncate(text.len() - 1 - lines.last().unwrap().len() / 2);
        }
        let d = campaign_dir(&fixture("campaign.json"), &text);
        read_all(d.path())?;
    }
}

/// The readers accept the fixture itself (the property tests above would pass vacuously if
/// every read failed).
#[test]
fn the_unmutated_fixture_reads() {
    let d = campaign_dir(&fixture("campaign.json"), &fixture("records.jsonl"));
    let t = load(d.path(), &HostMemory::default(), |_, _| {}).unwrap();
    assert_eq!(t.trials.len(), 360);
    assert_eq!(store::outcomes(d.path()).unwrap().len(), 360);
    let out = tempfile::tempdir().unwrap();
    assert_eq!(store::merge(&out.path().join("m"), &[d.path().to_path_buf()]).unwrap().trials, 360);
}
