//! The per-step trace (one JSON [`StepRecord`] per line) and the run description beside it.
//!
//! A trace is flushed after every record, so a crash loses at most the step in flight (the
//! record is written before that step's checkpoint, so a checkpoint at step `N` always has
//! records `1..=N` on disk). Resuming from a checkpoint at step `N` with the same trace path
//! keeps records `1..=N`, drops everything after (steps that will be run again, or a line torn
//! by the crash) and appends: the finished file equals, byte for byte, the uninterrupted run's.
//!
//! The run description (`<trace stem>.run.json`, e.g. `golden.run.json` beside
//! `golden.jsonl`) records the resolved run (model, machine as executed, [`RunIdentity`]) and
//! every invocation that wrote the trace (command line, mode, the step it started from and the
//! step it was to reach).

use crate::checkpoint::RunIdentity;
use crate::error::{io_err, Result, TrainError};
use crate::trainer::{StepRecord, Trainer};
use faultline_graph::ModelSpec;
use faultline_hw::files::{read_text_capped, TEXT_FILE_LIMIT};
use faultline_hw::{ExecMode, HwConfig};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Appends step records to a JSONL trace, one flushed line per step.
#[derive(Debug)]
pub struct TraceWriter {
    out: BufWriter<std::fs::File>,
    path: PathBuf,
}

impl TraceWriter {
    /// A new, empty trace at `path` (parent directories created; an existing file is replaced).
    pub fn create(path: &Path) -> Result<TraceWriter> {
        create_parent(path)?;
        let f = std::fs::File::create(path).map_err(io_err(path))?;
        Ok(TraceWriter { out: BufWriter::new(f), path: path.to_path_buf() })
    }

    /// Continues the trace of a run resumed from a checkpoint at `step`: the file must hold the
    /// records of steps `1..=step` in order (they are kept); later lines are dropped. A missing
    /// file starts a new trace whose first record is step `step + 1`.
    pub fn resume(path: &Path, step: u64) -> Result<TraceWriter> {
        if !path.exists() {
            return TraceWriter::create(path);
        }
        let bad = |detail: String| TrainError::Trace { file: path.to_path_buf(), detail };
        let f = std::fs::OpenOptions::new().read(true).write(true).open(path).map_err(io_err(path))?;
        let mut keep = 0u64;
        let mut reader = BufReader::new(&f);
        let mut line = String::new();
        for want in 1..=step {
            line.clear();
            let n = reader.read_line(&mut line).map_err(io_err(path))?;
            let complete = n > 0 && line.ends_with('\n');
            let rec: Option<StepRecord> = if complete { serde_json::from_str(&line).ok() } else { None };
            match rec {
                Some(r) if r.step == want => keep += n as u64,
                _ => {
                    return Err(bad(format!(
                        "the checkpoint is at step {step}, but line {want} is not the record of step {want}: this \
                         is not the trace of the checkpoint's run (pass another --trace path)"
                    )))
                }
            }
        }
        drop(reader);
        f.set_len(keep).map_err(io_err(path))?;
        let mut f = f;
        f.seek(SeekFrom::End(0)).map_err(io_err(path))?;
        Ok(TraceWriter { out: BufWriter::new(f), path: path.to_path_buf() })
    }

    /// Writes one record as a line and flushes it.
    pub fn write(&mut self, r: &StepRecord) -> Result<()> {
        let line = serde_json::to_string(r).expect("records serialise");
        writeln!(self.out, "{line}").and_then(|()| self.out.flush()).map_err(io_err(&self.path))
    }
}

fn create_parent(path: &Path) -> Result<()> {
    match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => std::fs::create_dir_all(dir).map_err(io_err(dir)),
        None => Ok(()),
    }
}

/// `<trace stem>.run.json` beside the trace, e.g. `traces/golden.run.json` for `traces/golden.jsonl`.
pub fn run_description_path(trace: &Path) -> PathBuf {
    let stem = trace.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "trace".into());
    trace.with_file_name(format!("{stem}.run.json"))
}

/// One invocation of the program that wrote (part of) a trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Invocation {
    /// The command line.
    pub command: Vec<String>,
    /// `functional` or `cycle` (either gives the same bits).
    pub mode: String,
    /// The checkpoint it resumed from, if any.
    pub resumed_from: Option<PathBuf>,
    /// Steps completed when it started.
    pub start_step: u64,
    /// The step it was to reach.
    pub target_step: u64,
    /// Faults it injected (text form), absent in fault-free runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub injected: Vec<String>,
}

/// Everything a trace depends on, resolved: with the trace it is a reproducible result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunDescription {
    /// Version of the program.
    pub faultline_version: String,
    /// The model file as given.
    pub model_file: PathBuf,
    /// The model definition.
    pub model: ModelSpec,
    /// The hardware config file as given.
    pub hw_config_file: PathBuf,
    /// The machine as executed (MXU input format set by the precision).
    pub hw: HwConfig,
    /// What defines the run (optimizer, precision, batch, seed, evaluation interval, data).
    pub run: RunIdentity,
    /// The initial-weights directory, if the run did not start from its seed.
    pub init_weights: Option<PathBuf>,
    /// Every invocation that wrote this trace, in order.
    pub invocations: Vec<Invocation>,
}

impl RunDescription {
    /// The description of `t`'s run, built from `model_file` (whose definition is `spec`) and
    /// `hw_config_file`, by one invocation (`command`) that starts at `start_step` and is to
    /// reach `target_step`, resuming from `resumed_from` if set.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        t: &Trainer,
        spec: &ModelSpec,
        model_file: &Path,
        hw_config_file: &Path,
        init_weights: Option<&Path>,
        command: Vec<String>,
        resumed_from: Option<&Path>,
        (start_step, target_step): (u64, u64),
    ) -> RunDescription {
        RunDescription {
            faultline_version: env!("CARGO_PKG_VERSION").into(),
            model_file: model_file.to_path_buf(),
            model: spec.clone(),
            hw_config_file: hw_config_file.to_path_buf(),
            hw: t.exec.hw.clone(),
            run: t.identity(),
            init_weights: init_weights.map(Path::to_path_buf),
            invocations: vec![Invocation {
                command,
                mode: if t.options.mode == ExecMode::CycleLevel { "cycle" } else { "functional" }.into(),
                resumed_from: resumed_from.map(Path::to_path_buf),
                start_step,
                target_step,
                injected: t.faults().iter().map(|f| f.to_string()).collect(),
            }],
        }
    }

    /// Writes the description for a trace at `trace`. When `resumed` and a description is
    /// already there, it must describe the same run; this invocation is appended to it.
    pub fn write_for(&self, trace: &Path, resumed: bool) -> Result<PathBuf> {
        let path = run_description_path(trace);
        let mut desc = self.clone();
        if resumed && path.exists() {
            let bad = |detail: String| TrainError::Trace { file: path.clone(), detail };
            let text = read_text_capped(&path, TEXT_FILE_LIMIT).map_err(io_err(&path))?;
            let old: RunDescription = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
            if old.run != self.run {
                return Err(bad("describes another run than the checkpoint's; pass another --trace path".into()));
            }
            desc.invocations = old.invocations.into_iter().chain(self.invocations.iter().cloned()).collect();
        }
        create_parent(&path)?;
        let partial = path.with_extension("json.partial");
        let text = serde_json::to_string_pretty(&desc).expect("descriptions serialise") + "\n";
        std::fs::write(&partial, text).map_err(io_err(&partial))?;
        std::fs::rename(&partial, &path).map_err(io_err(&path))?;
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn rec(step: u64) -> StepRecord {
        StepRecord {
            step,
            loss: 1.0 / step as f64,
            train_accuracy: 0.5,
            test_accuracy: None,
            grad_norm: 0.5,
            update_norm: 0.25,
            max_attention_logit: None,
            test_perplexity: None,
            cycles: 7,
            phase_cycles: BTreeMap::new(),
            unit_cycles: BTreeMap::new(),
            injection: None,
            checks: Vec::new(),
        }
    }

    #[test]
    fn resume_keeps_the_checkpoints_steps_and_drops_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/t.jsonl");
        let mut w = TraceWriter::create(&p).unwrap();
        for s in 1..=5 {
            w.write(&rec(s)).unwrap();
        }
        drop(w);
        let full = std::fs::read_to_string(&p).unwrap();
        // A crash tore line 6 and the newest checkpoint is at step 3.
        std::fs::write(&p, format!("{full}{{\"step\":6,\"lo")).unwrap();
        let mut w = TraceWriter::resume(&p, 3).unwrap();
        for s in 4..=5 {
            w.write(&rec(s)).unwrap();
        }
        drop(w);
        assert_eq!(std::fs::read_to_string(&p).unwrap(), full);
        // A trace that lacks the checkpoint's steps is another run's.
        let e = TraceWriter::resume(&p, 9).unwrap_err().to_string();
        assert!(e.contains("line 6 is not the record of step 6"), "{e}");
        std::fs::write(&p, full.replacen("\"step\":2", "\"step\":7", 1)).unwrap();
        assert!(TraceWriter::resume(&p, 3).is_err());
        // No file: a new trace.
        let q = dir.path().join("new.jsonl");
        TraceWriter::resume(&q, 3).unwrap().write(&rec(4)).unwrap();
        assert_eq!(std::fs::read_to_string(&q).unwrap().lines().count(), 1);
        assert_eq!(run_description_path(&p), dir.path().join("sub/t.run.json"));
    }

    /// A fault's step: NaN and infinite values are written as their names, distinguishably,
    /// read back (infinities bit for bit), and a trace holding them resumes.
    #[test]
    fn non_finite_values_are_written_by_name_and_read_back() {
        use crate::inject::InjectionReport;
        use faultline_graph::Phase;
        let mut r = rec(2);
        r.loss = f64::NAN;
        r.checks = vec![f32::INFINITY, f32::NEG_INFINITY, 0.25, f32::NAN];
        r.injection = Some(InjectionReport {
            fault: "flip:vpu.lane[3].out[30]@step=2,cycle=9".into(),
            instr: 4,
            op: "sgd".into(),
            node: "fc1.weight.next".into(),
            phase: Phase::Update,
            layer: "fc1".into(),
            unit_busy: true,
            tile: Some(0),
            tile_cycle: Some(9),
            elements: 64,
            corrupted: 2,
            max_abs_error: f64::INFINITY,
            max_rel_error: 3.5e38,
            buffer: "fc1.weight.next".into(),
        });
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.jsonl");
        let mut w = TraceWriter::create(&p).unwrap();
        let mut inf = rec(3);
        inf.loss = f64::INFINITY;
        for r in [&rec(1), &r, &inf] {
            w.write(r).unwrap();
        }
        drop(w);
        let text = std::fs::read_to_string(&p).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains(r#""loss":1.0,"#), "finite values stay numbers: {}", lines[0]);
        assert!(lines[1].contains(r#""loss":"NaN","#), "{}", lines[1]);
        assert!(lines[1].contains(r#""checks":["Infinity","-Infinity",0.25,"NaN"]"#), "{}", lines[1]);
        assert!(lines[1].contains(r#""max_abs_error":"Infinity","max_rel_error":3.5e+38,"#), "{}", lines[1]);
        assert!(lines[2].contains(r#""loss":"Infinity","#), "{}", lines[2]);
        let back: Vec<StepRecord> = lines.iter().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert!(back[1].loss.is_nan() && back[2].loss.to_bits() == f64::INFINITY.to_bits());
        let bits = |c: &[f32]| c.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        let (want, got) = (bits(&r.checks[..3]), bits(&back[1].checks[..3]));
        assert!(want == got && back[1].checks[3].is_nan());
        assert_eq!(back[1].injection, r.injection);
        assert_eq!((&back[0], &back[2]), (&rec(1), &inf));
        // Resuming checks the kept lines are records, NaN loss and all.
        TraceWriter::resume(&p, 3).unwrap();
        // A trace written before the names (`null` for every non-finite value) still reads.
        let old =
            lines[1].replace(r#""NaN""#, "null").replace(r#""Infinity""#, "null").replace(r#""-Infinity""#, "null");
        let r: StepRecord = serde_json::from_str(&old).unwrap();
        assert!(r.loss.is_nan() && r.checks.iter().filter(|c| c.is_nan()).count() == 3);
        assert!(r.injection.unwrap().max_abs_error.is_nan());
    }
}
