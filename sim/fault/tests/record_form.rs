//! The serialized form of a trial record, pinned: `records.jsonl` is the campaign's file
//! format, and its types live in `fault::record`, so no change elsewhere (`train`'s
//! `InjectionReport`, `graph`'s `Phase`) may alter a line.

use faultline_fault::record::{InjectionRecord, PhaseRecord, TrialRecord};
use faultline_fault::Outcome;
use faultline_graph::Phase;
use faultline_train::InjectionReport;

/// A simulated trial whose fault corrupted a GEMM's outputs, one error infinite.
fn record() -> TrialRecord {
    TrialRecord {
        schema: 3,
        campaign: "17d18623ecddb72a".into(),
        trial: 3,
        fault: "flip:mxu.pe[4][1].weight[0]@step=4,cycle=9237".into(),
        class: "mxu.pe[*][*].weight".into(),
        model: "flip".into(),
        bit: 0,
        element: 33,
        step: 4,
        cycle: 9237,
        skipped: false,
        verified_dead: false,
        outcome: Outcome::Benign,
        injection: Some(InjectionRecord {
            fault: "flip:mxu.pe[4][1].weight[0]@step=4,cycle=9237".into(),
            instr: 42,
            op: "gemm".into(),
            node: "d/fc1.matmul:b".into(),
            phase: PhaseRecord::Backward,
            layer: "fc1".into(),
            unit_busy: true,
            tile: Some(2),
            tile_cycle: Some(6),
            elements: 4096,
            corrupted: 34,
            max_abs_error: 0.0000152587890625,
            max_rel_error: f64::INFINITY,
            buffer: "d/fc1.matmul:b".into(),
        }),
        loss_delta: vec![0.0, 0.000020742416381835938, -5.9604644775390625e-6],
        test_accuracy_delta: Some(0.0),
        register_level_cycles: 2064,
        changed_predictions: None,
        detected_by: None,
    }
}

/// The line [`record`] is written as, byte for byte.
const LINE: &str = concat!(
    r#"{"schema":3,"campaign":"17d18623ecddb72a","trial":3,"#,
    r#""fault":"flip:mxu.pe[4][1].weight[0]@step=4,cycle=9237","class":"mxu.pe[*][*].weight","#,
    r#""model":"flip","bit":0,"element":33,"step":4,"cycle":9237,"skipped":false,"verified_dead":false,"#,
    r#""outcome":"Benign","injection":{"fault":"flip:mxu.pe[4][1].weight[0]@step=4,cycle=9237","#,
    r#""instr":42,"op":"gemm","node":"d/fc1.matmul:b","phase":"Backward","layer":"fc1","unit_busy":true,"#,
    r#""tile":2,"tile_cycle":6,"elements":4096,"corrupted":34,"max_abs_error":0.0000152587890625,"#,
    r#""max_rel_error":"Infinity","buffer":"d/fc1.matmul:b"},"#,
    r#""loss_delta":[0.0,0.000020742416381835938,-5.9604644775390625e-6],"test_accuracy_delta":0.0,"#,
    r#""register_level_cycles":2064,"changed_predictions":null}"#
);

#[test]
fn a_record_with_an_injection_is_written_as_pinned() {
    assert_eq!(serde_json::to_string(&record()).unwrap(), LINE);
}

#[test]
fn the_pinned_line_reads_back_as_the_record() {
    assert_eq!(serde_json::from_str::<TrialRecord>(LINE).unwrap(), record());
}

/// A skipped trial: no injection (`null`), and a detection written only when there is one.
#[test]
fn a_skipped_record_writes_a_null_injection_and_a_detection_only_when_present() {
    let mut r = TrialRecord { skipped: true, injection: None, loss_delta: vec![], ..record() };
    let text = serde_json::to_string(&r).unwrap();
    assert!(text.contains(r#","outcome":"Benign","injection":null,"loss_delta":[],"#), "{text}");
    assert!(!text.contains("detected_by"), "{text}");
    r.detected_by = Some("loss".into());
    let text = serde_json::to_string(&r).unwrap();
    assert!(text.ends_with(r#","changed_predictions":null,"detected_by":"loss"}"#), "{text}");
}

/// Every phase, as a record spells it.
#[test]
fn phases_are_spelled_as_pinned() {
    let spelled: Vec<String> = PhaseRecord::ALL.iter().map(|p| serde_json::to_string(p).unwrap()).collect();
    assert_eq!(spelled, [r#""Forward""#, r#""Backward""#, r#""Update""#]);
    let from: Vec<PhaseRecord> = Phase::ALL.into_iter().map(PhaseRecord::from).collect();
    assert_eq!(from, PhaseRecord::ALL);
}

/// The conversion from `train`'s report copies every field to its counterpart.
#[test]
fn an_injection_report_converts_field_by_field() {
    let report = InjectionReport {
        fault: "stuck1:ub.word[7][3]@step=2,cycle=10,for=5".into(),
        instr: 11,
        op: "add".into(),
        node: "fc2.bias (tile 2/3)".into(),
        phase: Phase::Update,
        layer: "fc2".into(),
        unit_busy: false,
        tile: None,
        tile_cycle: Some(9),
        elements: 640,
        corrupted: 0,
        max_abs_error: f64::NEG_INFINITY,
        max_rel_error: 0.5,
        buffer: "fc2.bias".into(),
    };
    let want = InjectionRecord {
        fault: "stuck1:ub.word[7][3]@step=2,cycle=10,for=5".into(),
        instr: 11,
        op: "add".into(),
        node: "fc2.bias (tile 2/3)".into(),
        phase: PhaseRecord::Update,
        layer: "fc2".into(),
        unit_busy: false,
        tile: None,
        tile_cycle: Some(9),
        elements: 640,
        corrupted: 0,
        max_abs_error: f64::NEG_INFINITY,
        max_rel_error: 0.5,
        buffer: "fc2.bias".into(),
    };
    let got = InjectionRecord::from(report);
    assert_eq!(got, want);
    assert!(got.masked());
}
