//! `faultline program`: the instructions one training step lowers to, with their schedule, the
//! units' busy cycles and the step's injection space, without running anything.

use anyhow::Result;
use clap::Args;
use faultline_graph::program::UnitCycles;
use faultline_graph::{ModelSpec, OpGraph, Program, StepSchedule, TrainGraph};
use faultline_hw::budget::HostMemory;
use faultline_hw::isa::Instr;
use faultline_hw::ExecMode;
use faultline_hw::HwConfig;
use faultline_train::inject::space;
use faultline_train::{Executor, MxuFormat, OptimizerKind};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Arguments of `faultline program`.
#[derive(Args, Debug)]
pub struct ProgramArgs {
    /// Model file (RON), e.g. models/mlp-digits.ron.
    #[arg(long)]
    pub model: PathBuf,
    /// Hardware config (RON), e.g. configs/tpu-32x32.ron.
    #[arg(long)]
    pub config: PathBuf,
    /// Minibatch size.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=1 << 24))]
    pub batch: u64,
    /// Optimizer: sgd, momentum, adam or adamw.
    #[arg(long, default_value = "sgd")]
    pub optimizer: String,
    /// MXU input format: bf16 (TPU-like, fp32 accumulate) or fp32, as `train --precision`
    /// takes it (the injection space's register widths and weight-buffer words follow it)
    /// [default: the config's input_format].
    #[arg(long)]
    pub precision: Option<String>,
    /// Lower the step with this protection plan's checks (configs/protect-*.ron): ABFT
    /// checksums, range checks, duplicates and Ranger's clamps appear as the instructions they
    /// are (a clamp's bound is learned by a campaign's golden run; here it is still wide open).
    #[arg(long, value_name = "PLAN")]
    pub protect: Option<PathBuf>,
    /// Print one JSON object (instructions, schedule, injection space) instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// One instruction of a program with its schedule, as `program` and `op` list them.
#[derive(Serialize)]
pub(crate) struct Row {
    index: usize,
    start: u64,
    cycles: u64,
    unit: &'static str,
    op: &'static str,
    shape: String,
    node: String,
    phase: &'static str,
    layer: String,
    writes: String,
}

#[derive(Serialize)]
struct Report {
    model: String,
    hw: String,
    batch: usize,
    optimizer: String,
    /// MXU input format of the run (`bf16` or `fp32`).
    precision: MxuFormat,
    cycles_per_step: u64,
    mxu_busy_cycles: u64,
    vpu_busy_cycles: u64,
    /// Cycles the DMA engine is occupied (data phases; transfers overlap their fixed overhead).
    dma_busy_cycles: u64,
    /// Busy and stall cycles per phase and unit.
    per_phase: BTreeMap<String, BTreeMap<String, UnitCycles>>,
    /// Busy and stall cycles per layer and unit.
    per_layer: BTreeMap<String, BTreeMap<String, UnitCycles>>,
    /// Multiply-accumulates of each phase's GEMMs.
    per_phase_macs: BTreeMap<String, u64>,
    /// Multiply-accumulates of each layer's GEMMs.
    per_layer_macs: BTreeMap<String, u64>,
    /// The MXU's processing elements (rows x cols): a layer's MACs over its MXU busy cycles
    /// times this is the share of the array its GEMMs keep busy.
    mxu_pes: u64,
    instructions: Vec<Row>,
    injection_space: Vec<space::ClassSummary>,
}

/// Runs the command.
pub fn run(a: ProgramArgs, mem: &HostMemory) -> Result<()> {
    let spec = ModelSpec::load(&a.model)?;
    let hw = HwConfig::load(&a.config)?;
    let optimizer: OptimizerKind = a.optimizer.parse()?;
    let precision = crate::args::precision(a.precision.as_deref(), &hw)?;
    let batch = a.batch as usize;
    let mut tg = TrainGraph::build(&spec, batch, optimizer.spec(None))?;
    if let Some(plan) = &a.protect {
        faultline_fault::protect::ProtectionPlan::load(plan)?.apply(
            &mut tg,
            &Executor::machine(&hw, precision),
            plan,
        )?;
    }
    mem.check(&format!("lowering `{}` with batch {batch}", spec.name), faultline_train::exec::host_bytes(&tg))?;
    // The program alone: nothing runs, so no data is loaded. On the machine of a run at this
    // precision, whose register widths and weight-buffer words the injection space counts.
    let exec = Executor::new(tg, &hw, ExecMode::Functional, precision)?;
    let sched = exec.schedule();
    let (p, s, g) = (exec.program(), &sched, &exec.tg.graph);
    let rows = rows(p, s, g);
    let (mut per_phase_macs, mut per_layer_macs) = (BTreeMap::new(), BTreeMap::new());
    for (ins, tag) in p.instrs.iter().zip(&p.tags) {
        if let faultline_hw::isa::Instr::Gemm { m, k, n, .. } = *ins {
            let macs = (m * k * n) as u64;
            *per_phase_macs.entry(tag.phase.name().to_string()).or_insert(0) += macs;
            *per_layer_macs.entry(tag.layer.clone()).or_insert(0) += macs;
        }
    }
    let report = Report {
        model: spec.name.clone(),
        hw: hw.name.clone(),
        batch,
        optimizer: a.optimizer.clone(),
        precision,
        cycles_per_step: s.total_cycles,
        mxu_busy_cycles: s.mxu_cycles,
        vpu_busy_cycles: s.vpu_cycles,
        dma_busy_cycles: s.dma_cycles,
        per_phase: s.per_phase_unit.iter().map(|(p, u)| (p.name().to_string(), u.clone())).collect(),
        per_layer: s.per_layer_unit.clone(),
        per_phase_macs,
        per_layer_macs,
        mxu_pes: (hw.mxu.rows * hw.mxu.cols) as u64,
        instructions: rows,
        injection_space: space::space(&exec, s),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "{} (batch {batch}, {}, {} MXU inputs) on {}: {} instructions, {} cycles per step",
        report.model,
        report.optimizer,
        report.precision,
        report.hw,
        report.instructions.len(),
        report.cycles_per_step
    );
    print_rows(&report.instructions);
    let pct = |c: u64| 100.0 * c as f64 / report.cycles_per_step.max(1) as f64;
    println!(
        "busy: MXU {} cycles ({:.1}%), VPU {} cycles ({:.1}%), DMA {} cycles ({:.1}%)",
        report.mxu_busy_cycles,
        pct(report.mxu_busy_cycles),
        report.vpu_busy_cycles,
        pct(report.vpu_busy_cycles),
        report.dma_busy_cycles,
        pct(report.dma_busy_cycles)
    );
    // `pe use`: the share of the array's multiply-accumulators the GEMMs use while the MXU
    // runs them (a narrow layer leaves columns idle; fills and drains leave rows idle).
    println!(
        "{:<12} {:>9} {:>9} {:>7} {:>9} {:>9} {:>9} {:>9}",
        "phase/layer", "mxu busy", "mxu stall", "pe use", "vpu busy", "vpu stall", "dma busy", "dma stall"
    );
    let phases = faultline_graph::Phase::ALL.iter().filter_map(|p| report.per_phase.get_key_value(p.name()));
    for (name, units) in phases.chain(&report.per_layer) {
        let u = |k: &str| units.get(k).copied().unwrap_or_default();
        let (m, v, d) = (u("mxu"), u("vpu"), u("dma"));
        let macs = report.per_phase_macs.get(name).or(report.per_layer_macs.get(name)).copied().unwrap_or(0);
        let pe = if m.busy == 0 {
            "-".to_string()
        } else {
            format!("{:.1}%", 100.0 * macs as f64 / (m.busy * report.mxu_pes) as f64)
        };
        println!(
            "{:<12} {:>9} {:>9} {:>7} {:>9} {:>9} {:>9} {:>9}",
            name, m.busy, m.stall, pe, v.busy, v.stall, d.busy, d.stall
        );
    }
    println!("injection space of one step (bit x cycle pairs; dead pairs are masked without running):");
    println!("{:<26} {:>8} {:>12} {:>16} {:>16}", "class", "bits", "busy cycles", "live bit-cycles", "dead bit-cycles");
    for c in &report.injection_space {
        println!("{:<26} {:>8} {:>12} {:>16} {:>16}", c.class, c.bits, c.busy_cycles, c.bit_cycles, c.idle_bit_cycles);
    }
    Ok(())
}

/// The instruction table of placed program `p` with schedule `s` (`g` names its nodes).
pub(crate) fn rows(p: &Program, s: &StepSchedule, g: &OpGraph) -> Vec<Row> {
    p.instrs
        .iter()
        .zip(&p.tags)
        .zip(&s.instrs)
        .enumerate()
        .map(|(index, ((ins, tag), cost))| Row {
            index,
            start: cost.start,
            cycles: cost.cycles,
            unit: ins.unit().name(),
            op: ins.name(),
            shape: match ins {
                Instr::Gemm { m, k, n, .. } => format!("{m}x{k}x{n}"),
                Instr::Vpu { n, .. } => n.to_string(),
                Instr::Dma { len, sram, .. } => format!("{len}w {}", sram.name()),
            },
            node: format!("{}{}", g.node(tag.node).name, tag.tile_suffix()),
            phase: tag.phase.name(),
            layer: tag.layer.clone(),
            writes: ins
                .writes()
                .iter()
                .map(|b| match p.home(*b) {
                    Some(h) => format!("{}@{}[{:#x}]", p.buffers[b.index()].name, h.mem.name(), h.base),
                    None => p.buffers[b.index()].name.clone(),
                })
                .collect::<Vec<_>>()
                .join(","),
        })
        .collect()
}

/// Prints the instruction table (a header line, then a line per instruction).
pub(crate) fn print_rows(rows: &[Row]) {
    println!(
        "{:>4} {:>7} {:>6}  {:<4} {:<15} {:>10}  {:<8} {:<10} {:<26} writes (buffer@home[word address])",
        "#", "start", "cycles", "unit", "op", "shape", "phase", "layer", "node"
    );
    for r in rows {
        println!(
            "{:>4} {:>7} {:>6}  {:<4} {:<15} {:>10}  {:<8} {:<10} {:<26} {}",
            r.index, r.start, r.cycles, r.unit, r.op, r.shape, r.phase, r.layer, r.node, r.writes
        );
    }
}
